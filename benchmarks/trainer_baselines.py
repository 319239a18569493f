"""How RL trainers batch a rollout today, re-implemented here from their sources (neither installs light: verl
imports Ray at its top, slime is not on PyPI), for ``bench_plan_batch`` and the adapters' tests.

- verl 0.9.1, ``verl/utils/seqlen_balancing.py``: ``karmarkar_karp`` (the largest differencing
  method; with ``equal_size`` over runs of k sorted items), ``rearrange_micro_batches`` (a rank's
  batch into ``ceil(total / max_token_len)`` Karmarkar-Karp parts of balanced workload
  ``24576*s + s^2``; since PR #7553 one more part at a time until none is over the cap, before it
  the first split as it came: ``verl_micro_batches(..., repartition=False)``).
- slime (THUDM/slime 624b824), ``slime/utils/dp_schedule.py`` and ``seqlen_balancing.py``: a
  step's samples first-fit into micro-batches of ``max_tokens_per_gpu * cp_size`` in rollout order
  (a sample over the cap alone), the largest multi-sample micro-batches split in two until the
  count divides by the data-parallel size, then Karmarkar-Karp with equal counts over their FLOPs.

Written from the algorithms as those files describe them, as plain Python like theirs (their time
is part of what is measured); TRL's packer is TRL's own (``trl.pack_dataset``), installed.
"""
from __future__ import annotations

import heapq

VERL_C = 24576  # verl's calculate_workload: 24576 * s + s^2


def _part_key(part: list) -> tuple:
    """Return the order of a part as verl's ``Set`` orders them: its sum, its count, its (index, value) items."""
    return part[0], len(part[1]), part[1]


class _State:
    """k parts, heaviest first, as verl's ``State``: popped first when its spread is larger (ties: its heaviest part
    is the larger)."""

    def __init__(self, parts: list):
        self.parts = sorted(parts, key=_part_key, reverse=True)

    def spread(self) -> float:
        return self.parts[0][0] - self.parts[-1][0]

    def __lt__(self, other: _State) -> bool:
        if self.spread() != other.spread():
            return self.spread() > other.spread()
        return _part_key(self.parts[0]) > _part_key(other.parts[0])


def verl_karmarkar_karp(values: list[float], k: int, equal_size: bool) -> list[list[int]]:
    """Return k parts (lists of indices) of ``values`` by the largest differencing method, as verl's.

    Items by (value, index) ascending; with ``equal_size`` each run of k is a state of one item per
    part, else each item a state of its own. The state of largest spread (heaviest part minus
    lightest) is merged with the next: part i of the first with part k-1-i of the second, parts
    kept heaviest first (by sum, then count, then items).
    """
    items = sorted((v, i) for i, v in enumerate(values))
    runs = [items[a:a + k] for a in range(0, len(items), k)] if equal_size else [[x] for x in items]
    heap: list[_State] = []
    for run in runs:
        parts = [[v, [(i, v)]] for v, i in run] + [[0, []] for _ in range(k - len(run))]
        heapq.heappush(heap, _State(parts))
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        merged = [[x[0] + y[0], x[1] + y[1]] for x, y in zip(a.parts, reversed(b.parts))]
        heapq.heappush(heap, _State(merged))
    return [[i for i, _ in p[1]] for p in heap[0].parts] if heap else [[] for _ in range(k)]


def verl_micro_batches(lengths: list[int], max_token_len: int, repartition: bool = True) -> list[list[int]]:
    """Return a rank's micro-batches as verl's ``rearrange_micro_batches`` cuts them (one rank, no groups).

    ``ceil(total / max_token_len)`` Karmarkar-Karp parts of balanced workload; with ``repartition``
    (verl 0.9.1, PR #7553) one more part at a time until every part's tokens fit the cap, without
    it the first split (which may exceed the cap). Ordered by workload, the lightest at both ends.
    """
    work = [VERL_C * s + s * s for s in lengths]
    count = min(len(lengths), -(-sum(lengths) // max_token_len))
    while True:
        parts = [sorted(p) for p in verl_karmarkar_karp(work, count, equal_size=False)]
        if not repartition or all(sum(lengths[i] for i in p) <= max_token_len for p in parts):
            break
        count += 1
    parts.sort(key=lambda p: (sum(work[i] for i in p), p[0] if p else 0), reverse=True)
    return parts[::2][::-1] + parts[1::2]


def slime_first_fit(lengths: list[int], cap: int) -> list[list[int]]:
    """Return slime's ``first_fit_pack``: each sample, in order, into the first micro-batch with room (or a new one)."""
    bins: list[list[int]] = []
    sums: list[int] = []
    for i, s in enumerate(lengths):
        for j in range(len(bins)):
            if sums[j] + s <= cap:
                bins[j].append(i)
                sums[j] += s
                break
        else:
            bins.append([i])
            sums.append(s)
    return bins


def slime_split(bins: list[list[int]], target: int, lengths: list[int]) -> None:
    """Split the micro-batch of most tokens with two samples or more in two (largest first to the lighter half),
    until there are ``target`` (slime's ``expand_bins_by_splitting``)."""
    while len(bins) < target:
        can = [(sum(lengths[i] for i in b), j) for j, b in enumerate(bins) if len(b) > 1]
        if not can:
            return
        _, j = max(can)
        halves: list[list[int]] = [[], []]
        sums = [0, 0]
        for i in sorted(bins[j], key=lambda i: -lengths[i]):
            h = 0 if sums[0] <= sums[1] else 1
            halves[h].append(i)
            sums[h] += lengths[i]
        bins[j] = halves[0]
        bins.append(halves[1])


def slime_schedule(lengths: list[int], dp: int, cap: int, flops_c: float, group: int = 1) -> list[list[list[int]]]:
    """Return each rank's micro-batches of one step as slime's dynamic ``build_dp_schedule`` with ``balance_data``."""
    bins = slime_first_fit(lengths, cap)
    align = dp * group
    slime_split(bins, max(-(-len(bins) // align) * align, align), lengths)
    weights = [sum(flops_c * lengths[i] + lengths[i] * lengths[i] for i in b) for b in bins]
    ranks = verl_karmarkar_karp(weights, dp, equal_size=True)
    return [[bins[j] for j in sorted(part)] for part in ranks]
