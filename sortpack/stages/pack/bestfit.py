"""Best fit over the budget and every cap at once: the windows of the sorted order it packs, and where its bins go.

``--cap-fit best`` (by default from two caps on) packs each window by ``kernels.fit_pack``: a
micro-batch (or a row) takes, again and again, the largest sample of its window that still fits
it under the budget and every cap. Where runs of the sorted order leave room under a cap that
binds on other samples than the budget does (images beside text tokens), a sample elsewhere in the
window fills it. ``fit_pieces`` packs the greedy's pieces, ``fit_rows`` the row windows of ``--rows``.
"""
from __future__ import annotations

import numpy as np

from ... import kernels
from .budgets import budget_of
from .options import FIT_WINDOW, PackOptions
from .packed import segment_reduce


def cap_values(opts: PackOptions, measures: dict[str, np.ndarray], a: int = 0, b: int | None = None
               ) -> tuple[np.ndarray | None, np.ndarray]:
    """Return ((K, b - a) measures of the K caps, or None without caps; their K limits) of samples ``a:b``."""
    caps = opts.cap_list
    if not caps:
        return None, np.zeros(0, np.int64)
    values = np.stack([np.asarray(measures[name][a:b], np.int64) for name, _ in caps])
    return values, np.array([n for _, n in caps], np.int64)


def _per_slot(opts: PackOptions) -> bool:
    """Return whether a micro-batch costs its slots at the padded length (padded budgets, rounding, same shape)."""
    return budget_of(opts).pads or opts.rounding or opts.static_shapes


def visit_key(opts: PackOptions, sizes: np.ndarray, measures: dict[str, np.ndarray], limit: int) -> np.ndarray:
    """Return each sample's largest share of a limit alone: its cost over ``limit`` or a measure over its cap
    (float64; best fit visits the largest first)."""
    from .fits import alone_cost

    key = alone_cost(opts, sizes) / float(limit) if not opts.rows else sizes / float(limit)
    for name, n in opts.cap_list:
        key = np.maximum(key, measures[name] / float(n))
    return key


def _placed(order: np.ndarray, bounds: np.ndarray, pos: np.ndarray, group: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (positions in bin order, bin bounds, each bin's group) of a best fit's bins, laid out by group, then
    by each bin's first position, its samples in position order (``pos``, ``group``: of each visited sample)."""
    nb = len(bounds) - 1
    member = pos[order]
    bin_of = np.repeat(np.arange(nb, dtype=np.int64), np.diff(bounds))
    first = segment_reduce(np.minimum, member, bounds)
    grp = group[order[bounds[:-1]]] if nb else np.zeros(0, np.int64)
    rank = np.lexsort((first, grp))
    place = np.empty(nb, np.int64)
    place[rank] = np.arange(nb, dtype=np.int64)
    laid = member[np.lexsort((member, place[bin_of]))]
    counts = np.diff(bounds)[rank]
    return laid, np.concatenate(([0], np.cumsum(counts))).astype(np.int64), grp[rank]


def fit_pieces(sizes: np.ndarray, measures: dict[str, np.ndarray], starts: np.ndarray, ends: np.ndarray,
               opts: PackOptions) -> tuple[np.ndarray, np.ndarray]:
    """Return (the samples' order, micro-batch bounds) of best fit over the budget and every cap, piece by piece.

    Each piece is cut into windows of at most ``FIT_WINDOW`` samples of the sorted order: under a
    per-slot cost (padded) runs of it, visited largest first, so a micro-batch still holds samples
    of about one size; varlen, every K-th sample of the piece (each window spans its sizes),
    visited by their largest share of a cap. A micro-batch never leaves its window; a piece's
    micro-batches follow the sorted position of their first sample (the curriculum stays).
    """
    n = len(sizes)
    pos = np.arange(n, dtype=np.int64)
    piece = np.repeat(np.arange(len(starts), dtype=np.int64), ends - starts)
    within = pos - np.repeat(starts, ends - starts)
    if _per_slot(opts):
        window, key = within // FIT_WINDOW, sizes.astype(np.float64)
    else:
        k = np.maximum(-(-(ends - starts) // FIT_WINDOW), 1)
        window, key = within % np.repeat(k, ends - starts), visit_key(opts, sizes, measures, opts.limit)
    visit = np.lexsort((pos, -key, window, piece))
    wid = piece[visit] * (n + 1) + window[visit]
    cuts = np.flatnonzero(np.concatenate(([True], wid[1:] != wid[:-1]))) if n else np.zeros(0, np.int64)
    values, lims = cap_values(opts, measures)
    shapes = np.asarray(opts.shapes, np.int64) if opts.shapes else None
    order, bounds = kernels.fit_pack(sizes[visit], opts.limit, budget_of(opts).kernel, opts.max_samples,
                                     opts.batch_multiple, opts.scale, opts.pad_to_multiple, shapes,
                                     None if values is None else values[:, visit], lims,
                                     np.concatenate((cuts, [n])))
    laid, bins, _ = _placed(order, bounds, pos[visit], piece[visit])
    return laid, bins


def fit_rows(room: np.ndarray, measures: dict[str, np.ndarray], starts: np.ndarray, ends: np.ndarray,
             opts: PackOptions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (the samples' order, row bounds, each window's row count) of best fit into rows of ``--rows`` tokens,
    at most ``--max-segments`` samples and every cap, window by window (``Windows``: each spans its stage's
    sizes). A window's rows follow the sorted position of their first sample."""
    n = len(room)
    pos = np.arange(n, dtype=np.int64)
    window = np.repeat(np.arange(len(starts), dtype=np.int64), ends - starts)
    visit = np.lexsort((pos, -visit_key(opts, room, measures, opts.rows), window))
    values, lims = cap_values(opts, measures)
    order, bounds = kernels.fit_pack(room[visit], opts.rows, "tokens", opts.max_segments,
                                     sizes2=None if values is None else values[:, visit], max2=lims,
                                     windows=np.concatenate((starts, [n])) if n else None)
    laid, rows, grp = _placed(order, bounds, pos[visit], window[visit])
    return laid, rows, np.bincount(grp, minlength=len(starts)).astype(np.int64)
