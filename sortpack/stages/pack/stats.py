"""The index summary of packed micro-batches, exact and the same for any rank count."""
from __future__ import annotations

import numpy as np

from ...parallel import Comm
from ..samples import exact_sum


def distinct_shapes(batch_size: np.ndarray, padded_size: np.ndarray) -> np.ndarray:
    """Return the distinct (batch size, padded length) pairs, a (2, K) int64 array in ascending order."""
    b, p = batch_size.astype(np.int64), np.asarray(padded_size).astype(np.int64)
    if not len(b):
        return np.zeros((2, 0), np.int64)
    if int(b.min()) >= 0 and int(p.min()) >= 0 and int(b.max()) < 1 << 31 and int(p.max()) < 1 << 32:
        # one int64 key per pair and a plain sort: unique(axis=1) sorts a void view, ten times slower
        key = np.sort((b << 32) | p)
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
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
