"""``--shapes auto:K``: the K padded lengths that waste the fewest tokens on this dataset.

Every rank counts its sizes, the counts are merged into one exact global histogram of
distinct sizes, and every rank runs the same exact dynamic program on it
(``kernels.optimal_lengths``), so all ranks choose the same lengths for any rank count.
"""
from __future__ import annotations

import numpy as np

from .. import kernels
from ..errors import SortpackError
from ..parallel import Comm
from ..partition import value_owners

# Largest size for which the histogram is a dense count vector summed over ranks
# (8 bytes per possible size, 32 MiB at 2^22); above, ranks merge sparse (size, count) pairs.
DENSE_LIMIT = 1 << 22


def parse_shapes(text: str) -> tuple[tuple[int, ...], int | None]:
    """Return (lengths, K) of a ``--shapes`` value: ``L1,L2,...`` gives K None, ``auto:K`` no lengths."""
    text = text.strip()
    if text.lower().startswith("auto"):
        k = text[4:].lstrip(":").strip()
        try:
            return (), int(k)
        except ValueError:
            raise SortpackError(f"--shapes {text!r}: expected auto:K with K an integer, e.g. auto:8") from None
    try:
        return tuple(int(x) for x in text.split(",")), None
    except ValueError:
        raise SortpackError(f"--shapes {text!r}: expected comma-separated integers or auto:K") from None


def global_histogram(comm: Comm, sizes: np.ndarray, dense_limit: int = DENSE_LIMIT) -> tuple[np.ndarray, np.ndarray]:
    """Return (distinct sizes, counts) over all ranks, increasing; sizes below 1 count as 1.

    Identical on every rank. Sizes up to ``dense_limit``: one Allreduce of a bincount.
    Larger: each rank sends its (size, count) pairs to rank ``size % P`` (Alltoallv), which
    merges them; the merged pairs, one per distinct size, are then allgathered.
    """
    sizes = np.maximum(np.asarray(sizes, dtype=np.int64), 1)
    hi = comm.allreduce(int(sizes.max()) if len(sizes) else 0, "max")
    if hi == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if hi < dense_limit:
        counts = comm.allreduce(np.bincount(sizes, minlength=hi + 1).astype(np.int64), "sum")
        values = np.flatnonzero(counts).astype(np.int64)
        return values, counts[values]
    values, counts = np.unique(sizes, return_counts=True)
    dest = value_owners(values, size=comm.size)
    order = np.argsort(dest, kind="stable")
    got = comm.alltoallv_many({"v": values[order], "c": counts[order].astype(np.int64)},
                              np.bincount(dest, minlength=comm.size))
    values, counts = _merge_pairs(got["v"], got["c"])
    values, counts = comm.allgatherv(values), comm.allgatherv(counts)
    order = np.argsort(values)  # distinct after the merge: the order is unique
    return values[order], counts[order]


def _merge_pairs(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (distinct values, summed counts) of possibly repeated (value, count) pairs."""
    if len(values) == 0:
        return values.astype(np.int64), counts.astype(np.int64)
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[starts], np.add.reduceat(counts, starts)


def padded_total(values: np.ndarray, counts: np.ndarray, lengths: np.ndarray) -> int:
    """Return sum(counts * smallest length >= value): the tokens after padding each sample alone."""
    if len(values) == 0:
        return 0
    lengths = np.asarray(lengths, np.int64)
    return int((counts * lengths[np.searchsorted(lengths, values, side="left")]).sum())


def choose_shapes(comm: Comm, sizes: np.ndarray, k: int,
                  dense_limit: int = DENSE_LIMIT) -> tuple[tuple[int, ...], dict]:
    """Return the at most ``k`` padded lengths minimising padded tokens of all ranks' sizes, and a summary.

    The lengths are distinct sizes of the data and the largest is the largest size, so every
    sample rounds to one of them; each sample is counted at the smallest length >= its size.
    The summary (for the manifest's stats) holds the request, the lengths, the number of
    distinct sizes and the padding of per-sample rounding, the floor any packing can reach.
    """
    values, counts = global_histogram(comm, sizes, dense_limit)
    try:
        lengths = kernels.optimal_lengths(values, counts, k)
    except ValueError as exc:
        raise SortpackError(f"--shapes auto:{k}: {exc}", collective=True) from None
    tokens = int((values * counts).sum())
    padded = padded_total(values, counts, lengths)
    info = {"request": f"auto:{k}", "lengths": [int(x) for x in lengths], "distinct_sizes": len(values),
            "rounded_tokens": padded, "rounding_padding_ratio": (1.0 - tokens / padded) if padded else 0.0}
    return tuple(int(x) for x in lengths), info
