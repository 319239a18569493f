"""The distributed sample sort of uint64 records (with an optional second key) and their payload.

Local sort, splitters, Alltoallv (counts, then payload), merge of the received runs: rank r
ends up holding the r-th range of the order. Splitters come from regular samples (Allgather),
or, for unique keys and ranges given up front, by exact selection: a few rounds of
multi-probe search over key values with one Allreduce of counts each, so each rank receives
exactly its final range and no second redistribution is needed.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import kernels
from ..parallel import Comm, fault_point
from ..progress import phase
from .key_codes import KeyLayout

SAMPLES_PER_RANK = 1024  # regular samples each rank contributes to choose splitters
PROBES = 255  # key values probed per splitter and round of exact selection (8 rounds span 64 bits)


class SortedRecords(NamedTuple):
    """One rank's range of records globally sorted by (hi, lo), with the payload in the same order."""

    hi: np.ndarray
    lo: np.ndarray | None  # None when hi alone is unique (keys packed with ids)
    payload: dict[str, np.ndarray]
    # uint64 memory the sort is done with (at least len(hi) when given): the caller's next array, not fresh pages
    spare: np.ndarray | None = None


def _sample_cuts(comm: Comm, hi: np.ndarray, lo: np.ndarray | None) -> np.ndarray:
    """Return where this rank's sorted records split by splitters chosen from regular samples (collective)."""
    n = len(hi)
    take = min(n, SAMPLES_PER_RANK)
    idx = ((np.arange(take, dtype=np.int64) + 1) * n) // (take + 1)
    s_hi = comm.allgatherv(hi[idx])
    s_lo = comm.allgatherv(lo[idx]) if lo is not None else None
    s_order = np.argsort(s_hi, kind="stable") if s_lo is None else np.lexsort((s_lo, s_hi))
    pick = s_order[(np.arange(1, comm.size, dtype=np.int64) * len(s_order)) // comm.size] \
        if len(s_order) else np.zeros(0, np.int64)
    split_hi = s_hi[pick]
    split_lo = s_lo[pick] if s_lo is not None else None
    return np.concatenate(([0], _splitter_cuts(hi, lo, split_hi, split_lo) if len(pick) else
                           np.zeros(comm.size - 1, np.int64), [n]))


def _splitter_cuts(hi: np.ndarray, lo: np.ndarray | None, split_hi: np.ndarray,
                   split_lo: np.ndarray | None) -> np.ndarray:
    """Return the positions of the splitters in locally sorted (hi[, lo]) records."""
    left = np.searchsorted(hi, split_hi, side="left")
    if lo is None or split_lo is None:  # both or neither: records and splitters come from the same sort
        return left
    right = np.searchsorted(hi, split_hi, side="right")
    return np.asarray([a + np.searchsorted(lo[a:b], s) for a, b, s in zip(left, right, split_lo)], dtype=np.int64)


def probe_values(below: np.ndarray, above: np.ndarray, probes: int) -> np.ndarray:
    """Return, per row, ``probes`` rising uint64 values strictly between ``below`` and ``above`` (object ints).

    Fewer distinct values exist when the gap is small: the row then repeats its last value.
    """
    gap = above - below  # Python ints: the bounds may be -1 and 2**64
    steps = np.arange(1, probes + 1, dtype=object)
    vals = below[:, None] + np.maximum((gap[:, None] * steps[None, :]) // (probes + 1), 1)
    return np.minimum(vals, (above - 1)[:, None])


def narrow(below: np.ndarray, above: np.ndarray, probes: np.ndarray, counts: np.ndarray,
           targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the new (below, above) bounds of each target's splitter from the global ``counts`` at ``probes``.

    The invariant: count(keys < below) < target <= count(keys < above); the splitter is the
    least value v with count(keys < v) >= target, in (below, above].
    """
    under = counts < targets[:, None]
    # probes rise along a row, so the ones under the target come first
    k = under.sum(axis=1)
    rows = np.arange(len(targets))
    new_below = np.where(k > 0, probes[rows, np.maximum(k - 1, 0)], below)
    new_above = np.where(k < probes.shape[1], probes[rows, np.minimum(k, probes.shape[1] - 1)], above)
    return new_below, new_above


def exact_cuts(comm: Comm, hi: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Return where this rank's sorted unique keys split so rank r receives positions [targets[r], targets[r+1]).

    Collective. The splitter of target t is the least key value v with count(keys < v) = t,
    found by ``PROBES``-ary search over values: each round counts the probes on every rank
    (``searchsorted``) and sums the counts in one Allreduce.
    """
    inner = np.asarray(targets[1:-1], dtype=np.int64)
    cuts = np.zeros(len(inner), np.int64)
    live = (inner > 0) & (inner < int(targets[-1]))
    cuts[inner >= int(targets[-1])] = len(hi)
    if not live.any():
        return np.concatenate(([0], cuts, [len(hi)]))
    want = inner[live]
    lo_key = comm.allreduce(np.array([hi[0] if len(hi) else np.iinfo(np.uint64).max], np.uint64), "min")[0]
    hi_key = comm.allreduce(np.array([hi[-1] if len(hi) else 0], np.uint64), "max")[0]
    below = np.full(len(want), int(lo_key) - 1, dtype=object)  # count(keys < min) = 0 < target
    above = np.full(len(want), int(hi_key) + 1, dtype=object)  # count(keys < max + 1) = total >= target
    probes = max(1, min(PROBES, (1 << 16) // len(want)))  # at most 64k probes per round
    while np.any(above - below > 1):
        vals = probe_values(below, above, probes)
        flat = vals.astype(np.uint64).ravel()
        counts = comm.allreduce(np.searchsorted(hi, flat, side="left").astype(np.int64), "sum")
        below, above = narrow(below, above, vals, counts.reshape(vals.shape), want)
    cuts[live] = np.searchsorted(hi, above.astype(np.uint64), side="left")
    return np.concatenate(([0], cuts, [len(hi)]))


class SortHints(NamedTuple):
    """What the caller knows of the records that makes the sort cheaper or exact.

    ``ids_from = (first, layout)`` (packed codes): the codes' ``id`` field holds the ids
    ``first + arange(n)``, so the local sort is a radix sort on the fields above the ids
    (``kernels.sort_id_ordered``) and the payload follows by the positions read back from
    the ids (no argsort). ``targets`` (P + 1 rising global positions, ending at the total),
    with unique ``hi``, makes rank r hold exactly positions ``[targets[r], targets[r+1])``;
    otherwise ranges are near-even. ``room`` (with ``ids_from``): the uint64 buffer whose first
    ``len(hi)`` elements are ``hi``, consumed with it; sized for this rank's target range, the
    sort receives and merges within it and its own scratch instead of fresh arrays.
    """

    ids_from: tuple[int, KeyLayout] | None = None
    targets: np.ndarray | None = None
    room: np.ndarray | None = None


def sample_sort(comm: Comm, hi: np.ndarray, lo: np.ndarray | None, payload: dict[str, np.ndarray],
                hints: SortHints | None = None) -> SortedRecords:
    """Return the records globally sorted by (hi, lo): rank r holds the r-th range.

    ``lo`` is None when ``hi`` alone is unique (keys packed with ids); ``hints`` (``SortHints``)
    what the caller knows of them.
    """
    hints = hints or SortHints()
    ids_from, targets = hints.ids_from, hints.targets
    if lo is None and ids_from is not None:
        first, layout = ids_from
        if not payload:
            return _sort_id_ordered_keys(comm, hi, layout, hints)
        # the ids rise in input order: a stable radix sort on the fields above them is the full sort
        hi = kernels.sort_id_ordered(hi, layout.id_bits, layout.bits - layout.id_bits)
        pos = layout.field(hi, "id").astype(np.int64) - first
        payload = {k: v[pos] for k, v in payload.items()}
    else:
        order = np.argsort(hi, kind="stable") if lo is None else np.lexsort((lo, hi))
        hi = hi[order]
        lo = None if lo is None else lo[order]
        payload = {k: v[order] for k, v in payload.items()}
    fault_point(comm, "sort")
    phase("local sort")
    if comm.size == 1:
        return SortedRecords(hi, lo, payload)

    if targets is not None and lo is None:
        cuts = exact_cuts(comm, hi, targets)
    else:
        cuts = _sample_cuts(comm, hi, lo)
    send = np.diff(cuts)
    recv = comm.exchange_counts(send)
    phase("splitters")
    keys_alone = lo is None and not payload
    # two ranks' keys alone: the own run is merged from where it lies, not copied into the received codes
    r_hi = comm.alltoallv(hi, send, recv, skip_self=keys_alone and comm.size == 2)
    r_lo = comm.alltoallv(lo, send, recv) if lo is not None else None
    r_payload = {k: comm.alltoallv(v, send, recv) for k, v in payload.items()}
    phase("exchange")
    offsets = np.concatenate(([0], np.cumsum(recv))).astype(np.int64)
    if keys_alone:
        if comm.size == 2:
            own = hi[cuts[comm.rank]:cuts[comm.rank + 1]]
            r_hi = kernels.merge_with_own_run(r_hi, int(recv[0]), own, own_first=comm.rank == 0)
        else:
            r_hi = kernels.merge_sorted_keys(r_hi, offsets)
        phase("merge")
        return SortedRecords(r_hi, None, {})
    if r_lo is None:
        r_hi, perm = kernels.merge_sorted_runs(r_hi, offsets)
    else:
        perm = kernels.merge_sorted_runs2(r_hi, r_lo, offsets)
        r_hi, r_lo = r_hi[perm], r_lo[perm]
    out = SortedRecords(r_hi, r_lo, {k: v[perm] for k, v in r_payload.items()})
    phase("merge")
    return out


def _sort_id_ordered_keys(comm: Comm, hi: np.ndarray, layout: KeyLayout, hints: SortHints) -> SortedRecords:
    """Return packed codes whose ids rise in input order sorted over all ranks, nothing riding along.

    Two buffers do all the work: the codes' own (``hints.room``, else ``hi``) and one scratch
    array, both sized for this rank's target range. The radix sort scatters into the scratch
    (nothing copied back), the exchange receives into the buffer the sort left free, the runs
    merge there or into the other one, and the one left over comes back as ``spare``: no
    other array as large as the codes is made, so every rank touches the same fresh memory
    as one rank alone.
    """
    n, rank = len(hi), comm.rank
    targets = hints.targets
    final = n if targets is None or comm.size == 1 else int(targets[rank + 1] - targets[rank])
    own_buf = hints.room if hints.room is not None and len(hints.room) >= n else hi
    scratch = np.empty(max(n, final), np.uint64)  # pages it never uses are never touched
    hi = kernels.sort_id_ordered(hi, layout.id_bits, layout.bits - layout.id_bits, scratch=scratch)
    held, free = (own_buf, scratch) if hi.ctypes.data == own_buf.ctypes.data else (scratch, own_buf)
    fault_point(comm, "sort")
    phase("local sort")
    if comm.size == 1:
        return SortedRecords(hi, None, {}, spare=free)
    comm.barrier()  # ranks finish their local sort apart: the first ones wait without spinning
    cuts = exact_cuts(comm, hi, targets) if targets is not None else _sample_cuts(comm, hi, None)
    send = np.diff(cuts)
    recv = comm.exchange_counts(send)
    phase("splitters")
    total = int(recv.sum())
    into = free[:total] if len(free) >= total else np.empty(total, np.uint64)
    if comm.size == 2:
        # two runs, one of them this rank's own (still in hi): it is not copied, the merge reads it there
        r_hi = comm.alltoallv(hi, send, recv, out=into, skip_self=True)
        phase("exchange")
        own = hi[cuts[rank]:cuts[rank + 1]]
        r_hi = kernels.merge_with_own_run(r_hi, int(recv[0]), own, own_first=rank == 0)
        spare: np.ndarray | None = held
    else:
        r_hi = comm.alltoallv(hi, send, recv, out=into)
        phase("exchange")
        offsets = np.concatenate(([0], np.cumsum(recv))).astype(np.int64)
        if len(held) >= total:
            # the passes ping-pong between the received runs and the sent codes' memory: no scratch
            r_hi, spare = kernels.merge_runs_between(r_hi, offsets, held)
        else:
            r_hi, spare = kernels.merge_sorted_keys(r_hi, offsets), into
    phase("merge")
    return SortedRecords(r_hi, None, {}, spare=spare)
