"""What the packing options let a sample or a padded length hold: oversize, truncation, static batch sizes.

The costs themselves (what a sample and a micro-batch cost, how they compare to the limit) are
the kernels' budget policy (``kernels.budget``); this module applies it to ``PackOptions``.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ... import kernels
from ...errors import SortpackError

if TYPE_CHECKING:  # the options' type only: options.py reads the --balance registry, which reads these
    from .options import PackOptions


def padded_lengths(opts: PackOptions, lengths: np.ndarray) -> np.ndarray:
    """Return the padded lengths of raw lengths under ``--pad-to-multiple``/``--shapes`` (-1 where no shape fits)."""
    return kernels.round_lengths(lengths, opts.pad_to_multiple,
                                 np.asarray(opts.shapes, np.int64) if opts.shapes else None)


def alone_cost(opts: PackOptions, sizes: np.ndarray) -> np.ndarray:
    """Return each sample's cost alone in a micro-batch (inf where no shape fits)."""
    lengths = padded_lengths(opts, sizes) if opts.rounding else np.asarray(sizes, np.int64)
    cost = kernels.sample_cost(lengths, opts.budget, opts.scale).astype(np.float64)
    cost[lengths < 0] = np.inf
    return cost


def oversize_mask(opts: PackOptions, sizes: np.ndarray, sizes2: np.ndarray | None = None) -> np.ndarray:
    """Return which samples cannot fit a micro-batch (or a row) alone (``sizes2``: their second size,
    over ``--max-size2`` alone too)."""
    if opts.rows:
        over = np.asarray(sizes) > opts.rows
    elif opts.budget != "quadratic" and not opts.rounding:
        over = np.asarray(sizes) > opts.limit  # cost alone is the size: no temporaries
    else:
        over = alone_cost(opts, sizes) > opts.limit
    if opts.max_size2 and sizes2 is not None:
        over |= np.asarray(sizes2) > opts.max_size2
    return over


def oversize_reason(opts: PackOptions, largest: int) -> str:
    """Return why samples up to ``largest`` do not fit alone, naming the option to change.

    The budget is not always to blame: a sample may exceed the largest of ``--shapes``,
    ``--pad-to-multiple`` may round it past the budget, or a small ``--quadratic-scale``
    may make its cost exceed the budget although its size does not.
    """
    b = opts.limit
    if opts.rows:
        return f"do not fit --rows {opts.rows} alone (largest size {largest}); raise --rows"
    if opts.shapes and largest > max(opts.shapes):
        return (f"are longer than the largest of --shapes ({max(opts.shapes)}; largest size {largest}); "
                f"add a longer shape")
    length = int(padded_lengths(opts, np.array([largest], np.int64))[0]) if opts.rounding else largest
    if opts.budget == "quadratic" and largest <= b:
        q = opts.scale
        return (f"cost more than --max-tokens {b} alone under --budget quadratic with --quadratic-scale {q:g} "
                f"(largest size {largest}, cost {largest + largest * largest / q:.4g}); raise --quadratic-scale "
                f"or --max-tokens")
    if length > b >= largest:
        flag = f"--pad-to-multiple {opts.pad_to_multiple}" if opts.pad_to_multiple > 1 else "--shapes"
        return (f"are padded past --max-tokens {b} by {flag} (largest size {largest} pads to {length}); "
                f"use a smaller {flag.split()[0]} or raise --max-tokens")
    return f"do not fit --max-tokens {b} alone (largest size {largest}); raise --max-tokens"


def truncate_length(opts: PackOptions) -> int:
    """Return the largest sample length that fits the budget alone (for ``--oversize truncate``)."""
    b = opts.limit
    if opts.rows:
        return opts.rows
    if opts.budget == "quadratic":
        q = opts.scale
        cap = int(math.floor(q * (math.sqrt(1.0 + 4.0 * b / q) - 1.0) / 2.0)) + 2
        while cap > 0 and cap + cap * cap / q > b:
            cap -= 1
    else:
        cap = b
    if opts.shapes:
        fitting = [s for s in opts.shapes if s <= cap]
        if not fitting:
            raise SortpackError(f"--shapes: no shape fits --max-tokens {b} alone")
        return fitting[-1]
    if opts.pad_to_multiple > 1:
        cap = (cap // opts.pad_to_multiple) * opts.pad_to_multiple
        if cap <= 0:
            raise SortpackError(f"--pad-to-multiple {opts.pad_to_multiple} exceeds --max-tokens {b}")
    return cap


def static_batch_size(opts: PackOptions, lengths: np.ndarray) -> np.ndarray:
    """Return the fixed batch size of each padded length under ``--static-shapes``.

    The most samples the budget (and ``--max-samples``) allows at that length, rounded
    down to a multiple of ``--batch-multiple`` when at least one multiple fits.
    """
    cap = kernels.batch_capacity(lengths, opts.limit, opts.budget, opts.scale, opts.max_samples)
    m = opts.batch_multiple
    return np.where(cap >= m, cap // m * m, cap)
