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
    """Return each sample's shares of the limits alone, summed: its cost over ``limit`` plus each measure over its
    cap (float64; best fit visits the largest first).

    The sum rather than the largest share (first fit decreasing by the sum of normalised sizes, a
    classic of vector bin packing): on the vision-language set of docs/multimodal.md it leaves
    fewer micro-batches of a lopsided cost (text alone, images alone), which a plan balanced by
    the two costs cannot place among like ones: p99 of the steps' max/mean at W = 64 about 1.035
    for both costs against about 1.05 by the largest share, for a binding fill of 0.998 against
    0.999.
    """
    from .fits import alone_cost

    key = alone_cost(opts, sizes) / float(limit) if not opts.rows else sizes / float(limit)
    for name, n in opts.cap_list:
        key = key + measures[name] / float(n)
    return key


def _placed(members: np.ndarray, bounds: np.ndarray, group: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (positions in bin order, bin bounds, each bin's group) of a best fit's bins (``members``: positions,
    bin after bin), laid out by group, then by each bin's first position, its samples in position order."""
    nb = len(bounds) - 1
    bin_of = np.repeat(np.arange(nb, dtype=np.int64), np.diff(bounds))
    first = segment_reduce(np.minimum, members, bounds)
    grp = group[members[bounds[:-1]]] if nb else np.zeros(0, np.int64)
    rank = np.lexsort((first, grp))
    place = np.empty(nb, np.int64)
    place[rank] = np.arange(nb, dtype=np.int64)
    laid = members[np.lexsort((members, place[bin_of]))]
    counts = np.diff(bounds)[rank]
    return laid, np.concatenate(([0], np.cumsum(counts))).astype(np.int64), grp[rank]


def _fit(sizes: np.ndarray, values: np.ndarray | None, group: np.ndarray, key: np.ndarray, opts: PackOptions
         ) -> tuple[np.ndarray, np.ndarray]:
    """Return (samples bin after bin, bin bounds) of best fit over the groups (windows) of the samples, each visited
    by ``key``, largest first (ties by position)."""
    n = len(sizes)
    visit = np.lexsort((np.arange(n), -key, group))
    g = group[visit]
    cuts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1]))) if n else np.zeros(0, np.int64)
    shapes = np.asarray(opts.shapes, np.int64) if opts.shapes else None
    order, bounds = kernels.fit_pack(sizes[visit], opts.limit, budget_of(opts).kernel, opts.max_samples,
                                     opts.batch_multiple, opts.scale, opts.pad_to_multiple, shapes,
                                     None if values is None else values[:, visit], [n for _, n in opts.cap_list],
                                     np.concatenate((cuts, [n])))
    return visit[order], bounds


def fit_pieces(sizes: np.ndarray, measures: dict[str, np.ndarray], starts: np.ndarray, ends: np.ndarray,
               opts: PackOptions) -> tuple[np.ndarray, np.ndarray]:
    """Return (the samples' order, micro-batch bounds) of best fit over the budget and every cap, piece by piece.

    Each piece is cut into windows of at most ``FIT_WINDOW`` samples of the sorted order: under a
    per-slot cost (padded) runs of it, visited largest first, so a micro-batch still holds samples
    of about one size; varlen, every K-th sample of the piece (each window spans its sizes),
    visited by their largest share of a cap, and the last micro-batch of every window (what its
    window left) is packed again with the other windows' last ones. A micro-batch never leaves
    its piece; a piece's micro-batches follow the sorted position of their first sample.
    """
    n = len(sizes)
    pos = np.arange(n, dtype=np.int64)
    piece = np.repeat(np.arange(len(starts), dtype=np.int64), ends - starts)
    within = pos - np.repeat(starts, ends - starts)
    values = cap_values(opts, measures)[0]
    if _per_slot(opts):
        members, bounds = _fit(sizes, values, piece * (n + 1) + within // FIT_WINDOW, sizes.astype(np.float64), opts)
        return _placed(members, bounds, piece)[:2]
    k = np.maximum(-(-(ends - starts) // FIT_WINDOW), 1)
    window = piece * (n + 1) + within % np.repeat(k, ends - starts)
    key = visit_key(opts, sizes, measures, opts.limit)
    members, bounds = _fit(sizes, values, window, key, opts)
    # each window's last micro-batch holds what the window left: packed again with the piece's other such ones
    heads = window[members[bounds[:-1]]]
    last = np.flatnonzero(np.concatenate((heads[1:] != heads[:-1], [True]))) if len(heads) else heads
    if len(last) > len(starts):
        again = np.zeros(n, bool)
        again[members[np.concatenate([np.arange(bounds[b], bounds[b + 1]) for b in last])]] = True
        keep = ~np.isin(np.arange(len(bounds) - 1), last)
        kept = members[np.repeat(keep, np.diff(bounds))]
        rest = np.flatnonzero(again)
        sub, sub_bounds = _fit(sizes[rest], None if values is None else values[:, rest], piece[rest], key[rest], opts)
        members = np.concatenate((kept, rest[sub]))
        bounds = np.concatenate((np.concatenate(([0], np.cumsum(np.diff(bounds)[keep]))),
                                 len(kept) + sub_bounds[1:])).astype(np.int64)
    return _placed(members, bounds, piece)[:2]


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
    laid, rows, grp = _placed(visit[order], bounds, window)
    return laid, rows, np.bincount(grp, minlength=len(starts)).astype(np.int64)
