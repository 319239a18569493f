"""``plan_batch``: one in-memory batch of sequence lengths packed into micro-batches and dealt to W ranks.

The steps: the inputs checked (``items``), sequences (or groups) over a cap refused or set apart
(``oversize="alone"``), the rest packed into rows by the pack stage's best fit (``rows``), rows
split until every rank gets the same count (``deal.split_rows``), rows dealt to ranks by
Karmarkar-Karp over their costs with equal counts (``deal.deal_rows``), each rank's micro-batches
costliest first. No MPI, no files, no torch; the same input gives the same plan.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import SortpackError
from ..kernels.gather import run_indices
from .deal import check_enough, deal_rows, per_rank_count, split_rows
from .items import Items, items_of, measures_of, oversize_of
from .options import BatchOptions
from .result import BatchPlan
from .rows import pack_items, stable_order
from .stats import plan_stats


def plan_batch(lengths, *, world_size: int, max_tokens: int, cost_coeff: float | None = None, targets=None,
               balance: str | None = None, pad_to_multiple: int = 0, equal_counts: bool = True,
               count_multiple: int = 1, min_microbatches: int = 0, groups=None, max_samples: int = 0,
               caps: Mapping | None = None, oversize: str = "error") -> BatchPlan:
    """Return the ``BatchPlan`` of one batch of sequence ``lengths`` for ``world_size`` ranks.

    Every sequence lands in exactly one micro-batch; no micro-batch holds more than ``max_tokens``
    tokens (each sequence counted at its length rounded up to ``pad_to_multiple``: context
    parallelism pads every document to 2 x CP) nor more than ``max_samples`` sequences, nor more
    than a second cap's limit (``caps={name: (values, limit)}``: encoder patches, frames). With
    ``equal_counts`` (the default) every rank gets the same number of micro-batches, a multiple of
    ``count_multiple`` (pipeline or virtual-pipeline groups) and at least ``min_microbatches``,
    none empty. Ranks are balanced by ``balance``: ``"tokens"`` (the default), ``"compute"``
    (``C*s + s^2`` per sequence, ``C = cost_coeff``; the default once ``cost_coeff`` is given) or
    ``"targets"`` (the loss ``targets`` per sequence, which then also compose the rows).
    ``groups`` (one id per sequence) keeps sequences of one id in one micro-batch (a prompt's
    samples). A sequence over a cap is an error naming it, or with ``oversize="alone"`` a
    micro-batch of its own (the one kind of micro-batch allowed over the cap).

    Examples
    --------
    Ten rollouts for two ranks, at most 1,000 tokens a micro-batch: four full micro-batches, two a rank:

    >>> from sortpack import plan_batch
    >>> plan = plan_batch([900, 100, 500, 480, 20, 300, 700, 60, 400, 540], world_size=2, max_tokens=1000)
    >>> [mb.tolist() for mb in plan.rank(0)], [mb.tolist() for mb in plan.rank(1)]
    ([[2, 3, 4], [0, 1]], [[7, 8, 9], [5, 6]])
    >>> plan.stats["microbatches"], plan.stats["lower_bound"], plan.stats["imbalance"]["tokens"]
    (4, 4, 1.0)
    """
    opts = BatchOptions(world_size, max_tokens, cost_coeff, balance, pad_to_multiple, bool(equal_counts),
                        count_multiple, min_microbatches, max_samples, oversize)
    opts.check()
    if caps is not None and not isinstance(caps, Mapping):
        raise SortpackError(f"plan_batch: caps={caps!r}: expected a mapping {{name: (values, limit)}}")
    measures = measures_of(lengths, targets, dict(caps) if caps else None, groups)
    items = items_of(measures, opts)
    over = oversize_of(items, opts)
    rows_items, row_splits = pack_items(items, np.flatnonzero(~over), opts)
    alone = np.flatnonzero(over)
    packed_rows = len(row_splits) - 1
    row_of = np.repeat(np.arange(packed_rows, dtype=np.int64), np.diff(row_splits))
    rows_items = np.concatenate((rows_items, alone))
    row_of = np.concatenate((row_of, packed_rows + np.arange(len(alone), dtype=np.int64)))
    assert items.weight is not None
    weight = items.weight
    if opts.equal_counts:
        per_rank = per_rank_count(packed_rows + len(alone), opts)
        check_enough(len(rows_items), "sequences" if items.count is None else "groups", per_rank, opts)
        row_of = split_rows(row_of, weight[rows_items], items.room[rows_items], per_rank * opts.world_size)
    rows = int(row_of.max()) + 1 if len(row_of) else 0
    cost = np.bincount(row_of, weight[rows_items], minlength=rows)
    rank = deal_rows(cost, opts.world_size)
    order = np.lexsort((np.arange(rows), -cost, rank))  # rank by rank, each rank's costliest micro-batch first
    indices, offsets = _sequences(items, rows_items, row_of, order)
    firsts = np.searchsorted(rank[order], np.arange(opts.world_size + 1))
    stats = plan_stats(measures, opts, (indices, offsets, firsts), {"rows": packed_rows + len(alone),
                                                                    "alone": len(alone)})
    return BatchPlan(opts.world_size, indices, offsets, firsts, measures.lengths, opts.pad_to_multiple,
                     measures.targets, measures.size2, stats)


def _sequences(items: Items, rows_items: np.ndarray, row_of: np.ndarray, order: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """Return (the sequences micro-batch after micro-batch in ``order`` of rows, ascending in each, the offsets)."""
    place = np.empty(len(order), np.int64)
    place[order] = np.arange(len(order))
    if items.members is None or items.offsets is None or items.count is None:
        seqs, mb = rows_items, place[row_of]
    else:
        count = items.count[rows_items]
        seqs = items.members[run_indices(items.offsets[rows_items], count)]
        mb = np.repeat(place[row_of], count)
    mb_of = np.empty(len(seqs), np.int64)
    mb_of[seqs] = mb
    indices = stable_order(mb_of)  # micro-batch by micro-batch, ascending inside each
    offsets = np.concatenate(([0], np.cumsum(np.bincount(mb_of, minlength=len(order))))).astype(np.int64)
    return indices, offsets
