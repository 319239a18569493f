"""What a packing makes: each rank's micro-batches as per-micro-batch arrays (``Packed``, ``BatchArrays``), and the
index's summary statistics.

The records only: they take no options, so the orders (``order``) and the ``--balance`` modes
(``balance``) read them below the options. ``batches`` builds them from the cut's boundaries;
the cut (``cut``) and the orders read and write them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...parallel import Comm
from ..samples import SampleColumns, exact_sum


@dataclass
class BatchArrays:
    """One rank's micro-batches as arrays: where each starts in the packed samples and its shape."""

    offsets: np.ndarray  # len M+1, into the packed samples
    num_samples: np.ndarray  # real samples per micro-batch
    batch_size: np.ndarray  # slots per micro-batch (rows in row packing), padding slots included
    max_size: np.ndarray  # largest real sample
    padded_size: np.ndarray  # the length every slot is padded to
    tokens: np.ndarray  # sum of the real samples' sizes


@dataclass
class Packed:
    """One rank's samples in micro-batch order, their micro-batches and what ``--oversize`` did."""

    sample_ids: np.ndarray
    keys: np.ndarray  # sort key per sample, int64 or float64 (recorded as float64 min_key/max_key)
    stage: np.ndarray  # int16 curriculum stage per sample
    batches: BatchArrays
    info: dict  # oversize counts over all ranks (and the auto:K summary)
    row_sizes: np.ndarray | None = None  # row packing: samples per row, rows in order
    begin: np.ndarray | None = None  # --oversize split: each sample's range in its source sample
    end: np.ndarray | None = None
    shapes: tuple[int, ...] = ()  # the padded lengths used: --shapes, or those --shapes auto:K chose
    sizes: np.ndarray | None = None  # each packed sample's size as packed (truncated ones at their cut)
    measures: dict[str, np.ndarray] = field(default_factory=dict)  # the samples' measures, in packed order


def key_values(samples: SampleColumns, key: str) -> np.ndarray:
    """Return the sort key ``key`` ("size" or "difficulty") of each sample, the column itself (int64 or float64).

    Not converted per sample: the index records each micro-batch's min and max as float64,
    converted after the reduction (the same values: the conversion keeps the order).
    """
    return samples.size if key == "size" else samples.difficulty


def segment_reduce(ufunc: np.ufunc, values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Return ``ufunc.reduce`` of ``values[offsets[i]:offsets[i+1]]`` per segment (0 when empty)."""
    if len(offsets) > 1 and bool((offsets[1:] > offsets[:-1]).all()):
        return ufunc.reduceat(values, offsets[:-1])  # no empty segment (the usual case): no scatter
    out = np.zeros(len(offsets) - 1, dtype=values.dtype)
    nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
    if len(nonempty):
        # reduceat runs each range up to the next index it is given; skipping the empty
        # segments (which hold no values) makes that exactly each segment's end
        out[nonempty] = ufunc.reduceat(values, offsets[nonempty])
    return out


def _run_heads(key: np.ndarray) -> np.ndarray:
    """Return the first value of each run of equal values in ``key``."""
    return key[np.concatenate(([True], key[1:] != key[:-1]))]


def distinct_shapes(batch_size: np.ndarray, padded_size: np.ndarray) -> np.ndarray:
    """Return the distinct (batch size, padded length) pairs, a (2, K) int64 array in ascending order."""
    b, p = batch_size.astype(np.int64), np.asarray(padded_size).astype(np.int64)
    if not len(b):
        return np.zeros((2, 0), np.int64)
    if int(b.min()) >= 0 and int(p.min()) >= 0 and int(b.max()) < 1 << 31 and int(p.max()) < 1 << 32:
        # one int64 key per pair and a plain sort: unique(axis=1) sorts a void view, ten times slower;
        # micro-batches cut from sorted sizes repeat their shape in runs, so runs collapse before the sort
        # one int64 key per pair and a plain sort: unique(axis=1) sorts a void view, ten times slower;
        # micro-batches cut from sorted sizes repeat their shape in runs, so runs collapse before the sort
        key = _run_heads(np.sort(_run_heads((b << 32) | p)))
        return np.stack([key >> 32, key & ((1 << 32) - 1)])
    return np.unique(np.stack([b, p]), axis=1)


# the per-micro-batch columns that are not sums of a per-sample quantity; every other one
# (``attention``, the measures: ``size2``, ``targets``) is, and the summary carries its total
SHAPE_COLUMNS = frozenset(("microbatch", "num_samples", "batch_size", "max_size", "padded_size", "tokens",
                           "min_key", "max_key", "stage", "source"))


def summed_columns(columns: dict[str, np.ndarray]) -> list[str]:
    """Return the names of the per-micro-batch columns that sum a per-sample quantity (sorted)."""
    return sorted(n for n in columns if n not in SHAPE_COLUMNS)


def microbatch_stats(comm: Comm, columns: dict[str, np.ndarray], info: dict) -> dict:
    """Return the index summary (integers and ratios of integers: identical for any rank count).

    Parameters
    ----------
    comm : Comm
        All ranks call it together.
    columns : dict of numpy.ndarray
        This rank's per-micro-batch columns (``num_samples``, ``batch_size``, ``padded_size``, ``tokens``).
    info : dict
        Figures merged into the summary as they are (what ``--oversize`` and ``--keep-empty`` did).
    """
    ns = columns["num_samples"].astype(np.int64)
    # Python ints, exact: sizes from a user's column may sum past int64
    padded_tokens = exact_sum(columns["batch_size"].astype(np.int64) * columns["padded_size"])
    parts = comm.allgather_obj((len(ns), exact_sum(ns), exact_sum(columns["tokens"]), padded_tokens))
    m, nsamp, tokens, padded = (sum(col) for col in zip(*parts))
    lo = comm.allreduce(int(ns.min()) if len(ns) else 2**62, "min")
    hi = comm.allreduce(int(ns.max()) if len(ns) else 0, "max")
    shapes = distinct_shapes(columns["batch_size"], columns["padded_size"])
    all_shapes = {tuple(x) for part in comm.allgather_obj(shapes.T.tolist()) for x in part}
    totals = {name: comm.allreduce(exact_sum(columns[name]), "sum") for name in summed_columns(columns)}
    return {
        "num_microbatches": m,
        "num_samples": nsamp,
        "tokens": tokens,
        "padded_tokens": padded,
        "padding_ratio": (1.0 - tokens / padded) if padded else 0.0,
        "distinct_shapes": len(all_shapes),
        "samples_per_microbatch": {"min": lo if m else 0, "max": hi, "mean": (nsamp / m) if m else 0.0},
        **totals,
        **info,
    }
