"""The per-micro-batch arrays of a cut (``BatchArrays``) from its boundaries: plain micro-batches, those of
``--static-shapes`` (the batch size fixed by the padded length) and ``--same-shape`` groups.
"""
from __future__ import annotations

import numpy as np

from .fits import padded_lengths, static_batch_size
from .options import PackOptions
from .packed import BatchArrays, segment_reduce

__all__ = ["plain_batches", "same_shape_groups", "static_batches"]


def plain_batches(bounds: np.ndarray, sizes: np.ndarray, opts: PackOptions) -> BatchArrays:
    """Return the arrays of plain micro-batches ``sizes[bounds[i]:bounds[i+1]]``."""
    count = np.diff(bounds)
    max_size = segment_reduce(np.maximum, sizes, bounds)
    tokens = segment_reduce(np.add, sizes, bounds)
    padded = padded_lengths(opts, max_size) if opts.rounding else max_size
    return BatchArrays(bounds, count, count, max_size, padded, tokens)


def static_batches(bounds: np.ndarray, sizes: np.ndarray, opts: PackOptions) -> BatchArrays:
    """Return the arrays of micro-batches with the batch size fixed by the padded length.

    The greedy never puts more samples at length L than the budget allows, but a piece's
    last micro-batch may hold more than the batch size rounded down to --batch-multiple:
    such a micro-batch is cut into full batches and a rest (each rounds to L or less, whose
    batch size is no smaller). Missing samples become padding slots, never repeats.
    """
    mb = plain_batches(bounds, sizes, opts)
    slots = static_batch_size(opts, mb.padded_size)
    count = mb.num_samples
    if np.any(slots < 1):
        raise RuntimeError("static shapes: a padded length holds no sample")  # oversize handling prevents it
    if np.any(count > slots):
        pieces = -(-count // slots)
        before = np.cumsum(pieces) - pieces
        nth = np.arange(int(pieces.sum()), dtype=np.int64) - np.repeat(before, pieces)
        bounds = np.concatenate((np.repeat(bounds[:-1], pieces) + nth * np.repeat(slots, pieces), bounds[-1:]))
        mb = plain_batches(bounds, sizes, opts)
        slots = static_batch_size(opts, mb.padded_size)
    mb.batch_size = slots
    return mb


def same_shape_groups(bounds: np.ndarray, sizes: np.ndarray, opts: PackOptions) -> BatchArrays:
    """Return the arrays after splitting each super-batch into G micro-batches of one shape.

    A super-batch of c samples becomes G micro-batches of ceil(c/G) slots each; the first
    c % G get one more real sample than the rest, whose spare slot is padding.
    """
    g = opts.group_size
    count = np.diff(bounds)
    slots = -(-count // g)
    base, extra = count // g, count % g
    j = np.tile(np.arange(g, dtype=np.int64), len(count))
    real = np.repeat(base, g) + (j < np.repeat(extra, g))
    offsets = np.concatenate(([0], np.cumsum(real)))
    max_size = segment_reduce(np.maximum, sizes, offsets)
    tokens = segment_reduce(np.add, sizes, offsets)
    group_max = np.maximum.reduceat(sizes, bounds[:-1]) if len(count) else np.zeros(0, np.int64)
    padded = padded_lengths(opts, group_max) if opts.rounding else group_max
    return BatchArrays(offsets.astype(np.int64), real, np.repeat(slots, g), max_size.astype(np.int64),
                       np.repeat(padded, g), tokens.astype(np.int64))
