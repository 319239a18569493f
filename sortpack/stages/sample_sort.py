"""The distributed sample sort of uint64 records (with an optional second key) and their payload.

Local sort, regular samples, Allgather of samples, splitters, Alltoallv (counts, then
payload), merge of the received runs: rank r ends up holding the r-th range of the order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..parallel import Comm, fault_point
from ..progress import phase

SAMPLES_PER_RANK = 1024  # regular samples each rank contributes to choose splitters


@dataclass
class SortedRecords:
    """One rank's range of records globally sorted by (hi, lo), with the payload in the same order."""

    hi: np.ndarray
    lo: np.ndarray | None  # None when hi alone is unique (keys packed with ids)
    payload: dict[str, np.ndarray]


def _splitter_cuts(hi: np.ndarray, lo: np.ndarray | None, split_hi: np.ndarray,
                   split_lo: np.ndarray | None) -> np.ndarray:
    """Return the positions of the splitters in locally sorted (hi[, lo]) records."""
    left = np.searchsorted(hi, split_hi, side="left")
    if lo is None or split_lo is None:  # both or neither: records and splitters come from the same sort
        return left
    right = np.searchsorted(hi, split_hi, side="right")
    return np.asarray([a + np.searchsorted(lo[a:b], s) for a, b, s in zip(left, right, split_lo)], dtype=np.int64)


def sample_sort(comm: Comm, hi: np.ndarray, lo: np.ndarray | None, payload: dict[str, np.ndarray],
                ids_from: tuple[int, int] | None = None) -> SortedRecords:
    """Return the records globally sorted by (hi, lo): rank r holds the r-th range.

    ``lo`` is None when ``hi`` alone is unique (keys packed with ids). For the packed
    form, ``ids_from = (first, id_bits)`` says the low ``id_bits`` bits are the ids
    ``first + arange(n)``: the local sort is then a plain ``np.sort`` and the payload
    follows by the positions read back from the ids (no argsort).
    """
    n = len(hi)
    if lo is None and ids_from is not None:
        hi.sort()
        if payload:
            first, id_bits = ids_from
            pos = (hi & np.uint64((1 << id_bits) - 1)).astype(np.int64) - first
            payload = {k: v[pos] for k, v in payload.items()}
    else:
        order = np.argsort(hi, kind="stable") if lo is None else np.lexsort((lo, hi))
        hi = hi[order]
        lo = None if lo is None else lo[order]
        payload = {k: v[order] for k, v in payload.items()}
    fault_point(comm, "sort")
    phase("local sort")
    if comm.size == 1:
        return SortedRecords(hi, lo, payload)

    take = min(n, SAMPLES_PER_RANK)
    idx = ((np.arange(take, dtype=np.int64) + 1) * n) // (take + 1)
    s_hi = comm.allgatherv(hi[idx])
    s_lo = comm.allgatherv(lo[idx]) if lo is not None else None
    s_order = np.argsort(s_hi, kind="stable") if s_lo is None else np.lexsort((s_lo, s_hi))
    pick = s_order[(np.arange(1, comm.size, dtype=np.int64) * len(s_order)) // comm.size] \
        if len(s_order) else np.zeros(0, np.int64)
    split_hi = s_hi[pick]
    split_lo = s_lo[pick] if s_lo is not None else None
    cuts = np.concatenate(([0], _splitter_cuts(hi, lo, split_hi, split_lo) if len(pick) else
                           np.zeros(comm.size - 1, np.int64), [n]))
    send = np.diff(cuts)
    recv = comm.exchange_counts(send)
    r_hi = comm.alltoallv(hi, send, recv)
    r_lo = comm.alltoallv(lo, send, recv) if lo is not None else None
    r_payload = {k: comm.alltoallv(v, send, recv) for k, v in payload.items()}
    phase("exchange")
    offsets = np.concatenate(([0], np.cumsum(recv))).astype(np.int64)
    if r_lo is None and not r_payload:
        # nothing rides along: merge the sorted runs in place (timsort finds the runs)
        r_hi.sort(kind="stable")
        return SortedRecords(r_hi, None, {})
    if r_lo is None:
        r_hi, perm = kernels.merge_sorted_runs(r_hi, offsets)
    else:
        perm = kernels.merge_sorted_runs2(r_hi, r_lo, offsets)
        r_hi, r_lo = r_hi[perm], r_lo[perm]
    return SortedRecords(r_hi, r_lo, {k: v[perm] for k, v in r_payload.items()})
