"""Balanced steps at any world size: micro-batches ordered so that consecutive ones cost alike.

The reader deals a step's W*A consecutive micro-batches to W ranks (``batches[rank::W]``). If
consecutive micro-batches cost about the same, every rank's share of every step does too,
whatever W and A are: the plan balances steps without knowing the topology. So, inside each
packing unit (a row-packing window, a greedy piece: both spread over the whole size range of
their stage, and never straddle ranks), micro-batches are put in order of their cost, ascending
in even units and descending in odd ones (global unit numbers), so a step that straddles two
units meets two neighbours of nearly the same cost too.

``BALANCE`` names what a micro-batch's cost is: the sum over its samples of a per-sample weight
(``--balance compute``: ``C*s + s^2``, ``--cost-coeff C``). Two caps (``--max-size2`` under
``--budget tokens``) order their micro-batches by both fills the same way (``two_cap_key``).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .batches import BatchArrays, Packed, segment_reduce


def compute_weight(sizes: np.ndarray, measures: dict[str, np.ndarray], cost_coeff: float) -> np.ndarray:
    """Return each sample's compute ``C*s + s^2`` (float64): its matrix products and its attention."""
    s = sizes.astype(np.float64)
    return cost_coeff * s + s * s


# --balance NAME -> the per-sample weight whose sum per micro-batch is the cost to balance
# (sizes and measures in packed order, the cost coefficient); "none" balances nothing
BALANCE: dict[str, Callable[[np.ndarray, dict[str, np.ndarray], float], np.ndarray] | None] = {
    "none": None,
    "compute": compute_weight,
}


def balance_names() -> list[str]:
    """Return the ``--balance`` choices, ``none`` first."""
    return ["none"] + sorted(k for k in BALANCE if k != "none")


def cost_key(packed: Packed, name: str, cost_coeff: float) -> np.ndarray:
    """Return each micro-batch's cost under ``--balance name`` (float64), the sum of its samples' weights."""
    weight = BALANCE[name]
    assert weight is not None and packed.sizes is not None
    return segment_reduce(np.add, weight(packed.sizes, packed.measures, cost_coeff), packed.batches.offsets)


def two_cap_key(tokens: np.ndarray, size2: np.ndarray, cap1: int, cap2: int, bins: int = 20) -> np.ndarray:
    """Return a key that orders micro-batches by both fills: the first's bin, then the second (serpentine).

    Micro-batches of near-equal first fill are grouped (``bins`` bins of the first cap) and
    ordered by their second fill, which runs up in one bin and down in the next: neighbours are
    alike in both measures.
    """
    f1 = tokens.astype(np.float64) / cap1
    f2 = np.minimum(size2.astype(np.float64) / cap2, 1.0)
    b = np.floor(np.minimum(f1, 1.0) * bins)
    return b + np.where(b % 2 == 1, 1.0 - f2, f2) * 0.5


def unit_order(units: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Return the micro-batch order: by unit, then by ``key`` ascending in even units and descending in odd ones.

    Ties keep their packed order.
    """
    m = len(units)
    signed = np.where(units % 2 == 1, -key, key)
    return np.lexsort((np.arange(m), signed, units)).astype(np.int64)


def _segments(offsets: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Return the indices of the flat values of segments ``order`` (of ``offsets``), in that order."""
    lens = np.diff(offsets)[order]
    starts = offsets[:-1][order]
    before = np.concatenate(([0], np.cumsum(lens)))[:-1]
    return (np.repeat(starts - before, lens) + np.arange(int(lens.sum()), dtype=np.int64)).astype(np.int64)


def reorder(packed: Packed, order: np.ndarray) -> Packed:
    """Return ``packed`` with its micro-batches in ``order`` (samples, rows and per-micro-batch arrays follow)."""
    mb = packed.batches
    take = _segments(mb.offsets, order)
    counts = np.diff(mb.offsets)[order]
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    batches = BatchArrays(offsets, mb.num_samples[order], mb.batch_size[order], mb.max_size[order],
                          np.asarray(mb.padded_size)[order], mb.tokens[order])
    row_sizes = packed.row_sizes
    if row_sizes is not None:
        # rows mode: batch_size is the rows of each micro-batch
        row_offsets = np.concatenate(([0], np.cumsum(mb.batch_size.astype(np.int64))))
        row_sizes = row_sizes[_segments(row_offsets, order)]
    out = Packed(packed.sample_ids[take], packed.keys[take], packed.stage[take], batches, packed.info, row_sizes,
                 None if packed.begin is None else packed.begin[take],
                 None if packed.end is None else packed.end[take], packed.shapes,
                 None if packed.sizes is None else packed.sizes[take],
                 {k: v[take] for k, v in packed.measures.items()})
    out.units = None if packed.units is None else packed.units[order]
    return out
