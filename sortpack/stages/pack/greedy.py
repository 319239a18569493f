"""Greedy packing: ranks take whole segments of the sorted order and pack each piece alone.

A piece is a run of sorted samples inside one segment of ``segment_size`` (global
positions) and one curriculum stage. Pieces never straddle ranks, so each rank packs its
own with no communication and the result does not depend on the rank count.
"""
from __future__ import annotations

import numpy as np

from ... import kernels
from ...distribute import global_start, redistribute
from ...parallel import Comm
from ...partition import owner_starts
from ...progress import Display, Progress
from ..samples import SampleColumns
from ..shapes import choose_shapes
from .batches import Packed, key_values, plain_batches, same_shape_groups, static_batches
from .budget import oversize_mask
from .filters import apply_oversize
from .options import PackOptions
from .two_caps import two_cap_order


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
    """Return micro-batch (or same-shape super-batch) boundaries for one piece (``sizes2``: the
    second size, capped by ``--max-size2``)."""
    g = opts.group_size if opts.same_shape else 1
    budget = opts.budget
    shapes = np.asarray(opts.shapes, np.int64) if opts.shapes else None
    if opts.same_shape and not opts.rounding:
        # A same-shape group pads every sample to one length L, so each costs as if it
        # were L long: tokens becomes c*L (the padded rule) and quadratic c*(L + L^2/Q),
        # which the kernel applies when lengths are rounded -- here to themselves.
        if budget == "tokens":
            budget = "padded"
        elif budget == "quadratic":
            shapes = np.unique(sizes)
    if opts.max_size2 and sizes2 is not None:
        return kernels.greedy_pack(sizes, opts.limit * g, budget, opts.max_samples * g, opts.batch_multiple * g,
                                   opts.scale, opts.pad_to_multiple, shapes, sizes2, opts.max_size2)
    return kernels.greedy_pack(sizes, opts.limit * g, budget, opts.max_samples * g, opts.batch_multiple * g,
                               opts.scale, opts.pad_to_multiple, shapes)


def balanced_caps(opts: PackOptions, samples: SampleColumns) -> bool:
    """Return whether the two caps are packed in ``two_cap_order``: ``--max-size2`` under ``--budget tokens``.

    Padded layouts keep the size order, which is what keeps their padding low.
    """
    return bool(opts.max_size2) and "size2" in samples.measures and opts.budget == "tokens" \
        and not opts.rounding and not opts.static_shapes and not opts.same_shape


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
        kept_before = np.concatenate(([0], np.cumsum(~oversize_mask(opts, cols["size"], cols.get("size2")))))
        starts = np.unique(kept_before[starts])
        starts = starts[starts < n]
    ends = np.concatenate((starts[1:], [n])) if len(starts) else np.zeros(0, np.int64)
    if n and balanced_caps(opts, samples):
        # varlen under two caps: an order whose every run holds both kinds of sample (two_caps)
        perm = two_cap_order(sizes, samples.measures["size2"], opts.limit, opts.max_size2, starts, ends)
        samples = samples.select(perm, samples.start, samples.total)
        sizes = samples.size
    if opts.auto_shapes is not None:
        # after --oversize: skipped samples do not count, truncated ones count at their cut size
        chosen, info["auto_shapes"] = choose_shapes(comm, sizes, opts.auto_shapes)
        opts = opts.with_shapes(chosen)  # the options stay the caller's: the result carries the lengths
    parts = [np.zeros(1, np.int64)]
    prog = Progress("pack", n, "rows", total, Display(ranks=comm.size))
    size2 = samples.measures.get("size2")
    for a, b in zip(starts, ends):
        parts.append(piece_bounds(sizes[a:b], opts, None if size2 is None else size2[a:b])[1:] + a)
        prog.update(b - a)
    prog.close()
    bounds = np.concatenate(parts)
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
