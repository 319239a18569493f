"""How to cut the sorted order into micro-batches: the greedy within fixed global pieces, best-fit rows, caps.

``pack_greedy`` cuts greedily within segments of ``segment_size`` sorted samples (also cut where
the curriculum stage changes): ranks own whole segments, so the cut does not depend on the rank
count. ``pack_rows`` bin-packs best-fit windows into fixed-length rows (``--rows``).
``two_cap_order`` is the order one cap beside the budget (``--max-size2``) packs in; under
``--cap-fit best`` (by default from two caps on) ``fit_pieces`` and ``fit_rows`` pack windows of
the sorted order by best fit over the budget and every cap at once (``kernels.fit_pack``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ... import kernels
from ...distribute import global_start, redistribute
from ...parallel import Comm
from ...partition import deal_windows, owner_starts
from ...progress import Display, Progress
from ..samples import SampleColumns, measures_in, with_measures
from .balance import balance_of
from .batches import plain_batches, same_shape_groups, static_batches
from .bestfit import cap_values, fit_pieces, fit_rows
from .budgets import budget_of
from .fits import apply_oversize, oversize_mask
from .options import PackOptions
from .packed import BatchArrays, Packed, key_values, segment_reduce


def two_cap_order(size: np.ndarray, size2: np.ndarray, caps: tuple[int, int], starts: np.ndarray,
                  ends: np.ndarray) -> np.ndarray:
    """Return the local order (int64 indices) of the samples, each piece ``[starts[i], ends[i])`` reordered in place
    (``caps``: the caps of ``size`` and ``size2``).

    Pieces keep their places and their samples; inside one, samples are merged by the normalised
    position of their cumulative lean within their side (see the module's text). Ties keep position.
    """
    n = len(size)
    if n == 0:
        return np.zeros(0, np.int64)
    assert len(starts) and int(starts[0]) == 0 and int(ends[-1]) == n, "pieces cover the samples"
    piece = np.zeros(n, np.int64)
    if len(starts) > 1:
        piece[np.asarray(starts[1:], np.int64)] = 1
        piece = np.cumsum(piece)
    cap1, cap2 = caps
    lean = np.asarray(size2, np.int64) * int(cap1) - np.asarray(size, np.int64) * int(cap2)
    side = (lean > 0).astype(np.int64)
    mass = np.abs(lean)
    # within (piece, side): increasing lean, ties by position
    order = np.lexsort((np.arange(n), mass, side, piece))
    p, sd, m = piece[order], side[order], mass[order]
    group = np.concatenate(([True], (p[1:] != p[:-1]) | (sd[1:] != sd[:-1])))
    first = np.flatnonzero(group)
    gid = np.cumsum(group) - 1
    cum = np.cumsum(m)  # exact int64 sums
    before = np.concatenate(([0], cum))[first][gid]  # the group's sum before its first sample
    upto = cum - before  # cumulative lean in the group, this sample included
    total = (cum[np.concatenate((first[1:] - 1, [n - 1]))] - before[first])[gid]
    # the midpoint of the sample's share, normalised to its group's whole: (2*upto - m) / (2*total)
    pos = np.where(total > 0, (2 * upto - m).astype(np.float64) / np.maximum(2 * total, 1).astype(np.float64),
                   (np.arange(n) - first[gid] + 0.5) / np.maximum(np.bincount(gid)[gid], 1))
    merged = np.lexsort((order, sd, pos, p))
    return order[merged]


def piece_starts(start: int, stage: np.ndarray, segment_size: int) -> np.ndarray:
    """Return local indices where a packing piece starts (a new segment or a new stage).

    This rank holds global positions ``[start, start + len(stage))``.
    """
    n = len(stage)
    if n == 0:
        return np.zeros(0, np.int64)
    first_seg = -(-start // segment_size) * segment_size - start
    seg = np.arange(first_seg, n, segment_size, dtype=np.int64)
    changes = np.flatnonzero(stage[1:] != stage[:-1]) + 1
    return np.unique(np.concatenate(([0], seg, changes)))


def piece_bounds(sizes: np.ndarray, opts: PackOptions, sizes2: np.ndarray | None = None) -> np.ndarray:
    """Return micro-batch (or same-shape super-batch) boundaries for one piece (``sizes2``: the (K, n) measures of
    the caps, or the ``size2`` measure of ``--max-size2``)."""
    g = opts.group_size if opts.same_shape else 1
    budget = budget_of(opts).kernel
    shapes = np.asarray(opts.shapes, np.int64) if opts.shapes else None
    if opts.same_shape and not opts.rounding:
        # A same-shape group pads every sample to one length L, so each costs as if it
        # were L long: each budget says how its kernel then packs (``Budget.same_shape``).
        budget, shapes = budget_of(opts).same_shape(sizes, shapes)
    if opts.cap_list and sizes2 is not None:
        return kernels.greedy_pack(sizes, opts.limit * g, budget, opts.max_samples * g, opts.batch_multiple * g,
                                   opts.scale, opts.pad_to_multiple, shapes, sizes2, [n for _, n in opts.cap_list])
    return kernels.greedy_pack(sizes, opts.limit * g, budget, opts.max_samples * g, opts.batch_multiple * g,
                               opts.scale, opts.pad_to_multiple, shapes)


def balanced_caps(opts: PackOptions, samples: SampleColumns) -> bool:
    """Return whether micro-batches under caps are ordered by their fills: caps under ``--budget tokens`` (varlen).

    One cap packs in ``two_cap_order`` (``--cap-fit runs``); padded layouts keep the size order,
    which is what keeps their padding low.
    """
    return bool(opts.cap_list) and all(name in samples.measures for name, _ in opts.cap_list) \
        and opts.budget == "tokens" and not opts.rounding and not opts.static_shapes and not opts.same_shape


def pack_greedy(comm: Comm, samples: SampleColumns, opts: PackOptions, key: str) -> Packed:
    """Return this rank's greedy micro-batches of globally sorted samples, after the ``--oversize`` policy."""
    # ranks must own whole segments so that pieces never straddle ranks
    cols = redistribute(comm, samples.columns(), samples.start,
                        owner_starts(samples.total, opts.segment_size, comm.size))
    start, total = global_start(comm, len(cols["sample_id"]))
    samples = SampleColumns.from_columns(start, total, cols, samples.files, samples.empty_size)
    starts = piece_starts(start, samples.stage_or_zero(), opts.segment_size)
    n_before = len(samples)
    samples, info = apply_oversize(comm, samples, opts)
    sizes = samples.size
    n = len(sizes)
    if n != n_before:
        # skipped samples shift the pieces: a piece now starts at the first kept sample
        kept_before = np.concatenate(([0], np.cumsum(~oversize_mask(opts, cols["size"], cols))))
        starts = np.unique(kept_before[starts])
        starts = starts[starts < n]
    ends = np.concatenate((starts[1:], [n])) if len(starts) else np.zeros(0, np.int64)
    if n and balanced_caps(opts, samples) and not opts.best_fit and len(opts.cap_list) == 1:
        # varlen under two caps: an order whose every run holds both kinds of sample (two_caps)
        name, cap = opts.cap_list[0]
        perm = two_cap_order(sizes, samples.measures[name], (opts.limit, cap), starts, ends)
        samples = samples.select(perm, samples.start, samples.total)
        sizes = samples.size
    if opts.auto_shapes is not None:
        from ..shapes import choose_shapes  # --shapes auto only

        # after --oversize: skipped samples do not count, truncated ones count at their cut size
        chosen, info["auto_shapes"] = choose_shapes(comm, sizes, opts.auto_shapes)
        opts = opts.with_shapes(chosen)  # the options stay the caller's: the result carries the lengths
    prog = Progress("pack", n, "rows", total, Display(ranks=comm.size))
    if opts.best_fit:
        perm, bounds = fit_pieces(sizes, samples.measures, starts, ends, opts)
        samples = samples.select(perm, samples.start, samples.total)
        sizes = samples.size
        prog.update(n)
    else:
        parts = [np.zeros(1, np.int64)]
        for a, b in zip(starts, ends):
            parts.append(piece_bounds(sizes[a:b], opts, cap_values(opts, samples.measures, a, b)[0])[1:] + a)
            prog.update(b - a)
        bounds = np.concatenate(parts)
    prog.close()
    if opts.same_shape:
        batches = same_shape_groups(bounds, sizes, opts)
    elif opts.static_shapes:
        batches = static_batches(bounds, sizes, opts)
    else:
        batches = plain_batches(bounds, sizes, opts)
    packed = Packed(samples.sample_id, key_values(samples, key), samples.stage_or_zero(), batches, info,
                    shapes=tuple(opts.shapes), sizes=sizes, measures=samples.measures)
    if samples.begin is not None:
        packed.begin, packed.end = samples.begin, samples.begin + samples.size
    return packed


@dataclass
class Windows:
    """One rank's samples grouped by best-fit window, sorted order kept inside each window."""

    sample_ids: np.ndarray
    sizes: np.ndarray
    keys: np.ndarray
    stage: np.ndarray
    starts: np.ndarray  # local index where each window starts
    ends: np.ndarray  # and where it ends
    begin: np.ndarray | None = None  # --oversize split: each sample's range start in its source sample
    measures: dict[str, np.ndarray] = field(default_factory=dict)  # the samples' measures, in window order


def deal_to_windows(comm: Comm, samples: SampleColumns, keys: np.ndarray, opts: PackOptions) -> Windows:
    """Return this rank's row-packing windows.

    A window takes every K-th sample of a curriculum stage in sorted order (K windows per
    stage of ``window`` samples each), so each window spans the stage's whole size range:
    best-fit then fills rows as well as over the whole stage. Windows are numbered
    globally and dealt to ranks in contiguous blocks (``partition.deal_windows``, then one
    Alltoallv); inside a window samples keep their sorted order. Nothing depends on the
    number of ranks.
    """
    n = len(samples.sample_id)
    start, total = global_start(comm, n)
    stage_of = samples.stage_or_zero()
    stage = stage_of.astype(np.int64)
    width = comm.allreduce(int(stage.max()) + 1 if n else 1, "max")
    per_stage = comm.allreduce(np.bincount(stage, minlength=width).astype(np.int64), "sum")
    pos = np.arange(start, start + n, dtype=np.int64)
    window, dest = deal_windows(pos, stage, per_stage, opts.window(), size=comm.size)
    order = np.argsort(dest, kind="stable")
    cols = {"id": samples.sample_id[order], "size": samples.size[order], "key": keys[order],
            "stage": stage_of[order], "window": window[order], "pos": pos[order]}
    if samples.begin is not None:
        cols["begin"] = samples.begin[order]
    cols = with_measures(cols, {k: v[order] for k, v in samples.measures.items()})
    cols = comm.alltoallv_many(cols, np.bincount(dest, minlength=comm.size))
    order = np.lexsort((cols["pos"], cols["window"]))
    cols = {k: v[order] for k, v in cols.items()}
    w = cols["window"]
    starts = np.flatnonzero(np.concatenate(([True], w[1:] != w[:-1]))) if len(w) else np.zeros(0, np.int64)
    ends = np.concatenate((starts[1:], [len(w)])) if len(w) else np.zeros(0, np.int64)
    return Windows(cols["id"], cols["size"], cols["key"], cols["stage"], starts, ends, cols.get("begin"),
                   measures_in(cols))



def window_rows(room: np.ndarray, size2: np.ndarray | None, opts: PackOptions) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) of one window's samples packed into rows.

    Best-fit-decreasing; under one cap (``--max-size2`` or ``--cap``: each row's sum of its
    measure at most N too) the window's samples in ``two_cap_order`` are cut into rows by the
    two-cap greedy (``--cap-fit runs``), so each row holds both kinds of sample in the window's
    proportion.
    """
    if size2 is None:
        return kernels.pack_rows(room, opts.rows, opts.max_segments)
    n = len(room)
    size2 = np.atleast_2d(size2)  # one measure (sortpack.batch's) or K rows of them
    lims = [cap for _, cap in opts.cap_list]
    if len(size2) > 1:  # several caps cut by runs: the window's sorted order, no order of two
        order = np.arange(n, dtype=np.int64)
    else:
        order = two_cap_order(room, size2[0], (opts.rows, lims[0]), np.zeros(1, np.int64), np.array([n]))
    splits = kernels.greedy_pack(room[order], opts.rows, "tokens", opts.max_segments, sizes2=size2[:, order],
                                 max2=lims)
    return order, splits


def composed_rows(sizes: np.ndarray, room: np.ndarray, targets: np.ndarray, opts: PackOptions
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) of one window's rows composed by their targets (``--balance targets``: the mode's
    int64 weights).

    The rows best fit packs (the same sizes in each), with the samples of each size placed so
    that every row's targets come near the window's mean (``compose``); the samples of a row in
    window order.
    """
    from .compose import compose_rows, exchange_heavy, targets_spread  # --balance targets only

    spread = targets_spread(sizes, targets)
    room, targets = room[spread], targets[spread]
    order, row_splits = window_rows(room, None, opts)
    order = compose_rows(_size_classes(sizes[spread], room), targets, order, row_splits)
    order, row_splits = exchange_heavy(room, targets, order, row_splits, (opts.rows, opts.max_segments))
    order = spread[order]
    row = np.repeat(np.arange(len(row_splits) - 1, dtype=np.int64), np.diff(row_splits))
    return order[np.lexsort((order, row))], row_splits


def _size_classes(sizes: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Return each item's class of equal size and room, numbered by size, then room (int64, from 0).

    Composing exchanges items of one class only, so every row keeps its tokens and what its cap
    counts. A sample's room is its size rounded up, one class per size; a ``plan_batch`` group pads
    each member, so two groups of one size can differ in room.
    """
    order = np.lexsort((room, sizes))
    s, r = sizes[order], room[order]
    new = np.ones(len(s), bool)
    new[1:] = (s[1:] != s[:-1]) | (r[1:] != r[:-1])
    out = np.empty(len(s), np.int64)
    out[order] = np.cumsum(new) - 1
    return out


def window_plan(sizes: np.ndarray, room: np.ndarray, size2: np.ndarray | None, weights: np.ndarray | None,
                opts: PackOptions) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) of one window's samples in rows: best fit (``window_rows``, caps with
    ``size2``: one measure, or K rows of them), or rows composed by the ``weights`` of a balance that composes
    them (``composed_rows``). Pure: ``sortpack.batch`` packs with it too.
    """
    if weights is None:
        return window_rows(room, size2, opts)
    return composed_rows(sizes, room, weights, opts)


def _window_rows(sizes: np.ndarray, room: np.ndarray, win: Windows, weights: np.ndarray | None, opts: PackOptions
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (the samples' order, row bounds, each window's row count) of ``window_plan`` window by window."""
    perms, splits, counts = [], [np.zeros(1, np.int64)], []
    prog = Progress("pack", len(sizes), "rows")
    caps = cap_values(opts, win.measures)[0]
    for a, b in zip(win.starts, win.ends):
        order, row_splits = window_plan(sizes[a:b], room[a:b], None if caps is None else caps[:, a:b],
                                        None if weights is None else weights[a:b], opts)
        prog.update(b - a)
        perms.append(order + a)
        splits.append(row_splits[1:] + a)
        counts.append(len(row_splits) - 1)
    prog.close()
    perm = np.concatenate(perms) if perms else np.zeros(0, np.int64)
    return perm, np.concatenate(splits), np.asarray(counts, np.int64)




def pack_rows(comm: Comm, samples: SampleColumns, opts: PackOptions, key: str) -> Packed:
    """Return this rank's row-packed micro-batches of globally sorted samples, after the ``--oversize`` policy.

    Each window is packed best-fit-decreasing; every ``rows_per_microbatch`` consecutive
    rows of a window make one micro-batch. With ``--pad-to-multiple K`` each document counts
    at its length rounded up to K (``tokens`` and ``max_size`` stay the real sizes); with
    ``--max-size2 N`` no row holds more than N of the second size (``window_rows``).
    """
    samples, info = apply_oversize(comm, samples, opts)
    win = deal_to_windows(comm, samples, key_values(samples, key), opts)
    sizes = win.sizes
    k = opts.pad_to_multiple
    # --pad-to-multiple K: a document takes its length rounded up to K in its row (context
    # parallelism pads each document to 2 x CP), so the padded rows still fit ROW_LEN
    room = -(-sizes // k) * k if k > 1 else sizes
    # --balance targets: rows composed so that each carries about the same weight (compose.py); the mode refuses
    # caps (its check)
    balance = balance_of(opts)
    weights = balance.weight(sizes, win.measures) if balance.composes_rows else None
    if opts.best_fit and weights is None:
        perm, row_ends, per_window = fit_rows(room, win.measures, win.starts, win.ends, opts)
    else:
        perm, row_ends, per_window = _window_rows(sizes, room, win, weights, opts)
    # every rows_per_microbatch consecutive rows of a window make a micro-batch
    r = opts.rows_per_microbatch
    first_row = np.concatenate(([0], np.cumsum(per_window)))[:-1]
    per_mb = -(-per_window // r)
    nth = np.arange(int(per_mb.sum()), dtype=np.int64) - np.repeat(np.cumsum(per_mb) - per_mb, per_mb)
    mb_row_ends = np.concatenate(([0], np.minimum((nth + 1) * r, np.repeat(per_window, per_mb))
                                  + np.repeat(first_row, per_mb))).astype(np.int64)
    offsets = row_ends[mb_row_ends]
    ordered = sizes[perm]
    batches = BatchArrays(offsets, np.diff(offsets), np.diff(mb_row_ends), segment_reduce(np.maximum, ordered, offsets),
                          np.full(len(offsets) - 1, opts.rows, np.int64), segment_reduce(np.add, ordered, offsets))
    packed = Packed(win.sample_ids[perm], win.keys[perm], win.stage[perm], batches, info, np.diff(row_ends),
                    sizes=ordered, measures={k: v[perm] for k, v in win.measures.items()})
    if win.begin is not None:
        packed.begin = win.begin[perm]
        packed.end = packed.begin + ordered
    return packed
