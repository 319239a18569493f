"""Moving rows between ranks by global position (Exscan + Alltoallv)."""
from __future__ import annotations

import numpy as np

from .parallel import Comm


def redistribute(comm: Comm, columns: dict[str, np.ndarray], my_start: int,
                 dest_starts: np.ndarray) -> dict[str, np.ndarray]:
    """Return the columns re-dealt so rank p holds global rows ``[dest_starts[p], dest_starts[p+1])``.

    This rank holds global rows ``[my_start, my_start + n)``; rows keep their global order.
    """
    n = len(next(iter(columns.values())))
    dest_starts = np.asarray(dest_starts, dtype=np.int64)
    in_place = int(dest_starts[comm.rank]) == my_start and int(dest_starts[comm.rank + 1]) == my_start + n
    if comm.allreduce(int(in_place), "min"):
        return dict(columns)  # every rank already holds its range: nothing moves, nothing is copied
    cuts = np.clip(dest_starts - my_start, 0, n)
    return comm.alltoallv_many(columns, np.diff(cuts))


def global_start(comm: Comm, n: int) -> tuple[int, int]:
    """Return (first global position of this rank's n rows, total rows over ranks)."""
    start = comm.exscan(n)
    return start, comm.allreduce(int(n), "sum")


def move_ragged(comm: Comm, values: np.ndarray, lengths: np.ndarray, first: int, dest: np.ndarray) -> np.ndarray:
    """Return the flat values of the micro-batches this rank owns after the move to ``dest``."""
    m = len(lengths)
    offsets = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    flat_start, flat_total = global_start(comm, len(values))
    # where each owner's first micro-batch starts in the flat list: only the rank holding that
    # micro-batch knows it; a max-reduction shares it
    known = np.full(comm.size + 1, -1, dtype=np.int64)
    local = (dest >= first) & (dest < first + m)
    known[local] = flat_start + offsets[dest[local] - first]
    known[dest >= dest[-1]] = flat_total  # owners starting at the end own nothing
    starts = comm.allreduce(known, "max")
    return redistribute(comm, {"v": values}, flat_start, starts)["v"]


def fetch_rows(comm: Comm, columns: dict[str, np.ndarray], my_start: int,
               positions: np.ndarray) -> dict[str, np.ndarray]:
    """Return the values of the rows at global ``positions`` (any order), each rank holding a contiguous block.

    This rank holds global rows ``[my_start, my_start + n)`` of ``columns``; one Alltoallv
    sends each request to the rank holding the row, one more brings the values back.
    """
    n = len(next(iter(columns.values())))
    starts = np.asarray(comm.allgather_obj(int(my_start)) + [0], dtype=np.int64)
    starts[-1] = comm.allreduce(int(my_start + n), "max")
    positions = np.asarray(positions, dtype=np.int64)
    owner = np.searchsorted(starts, positions, side="right") - 1
    order = np.argsort(owner, kind="stable")
    asked = comm.alltoallv_many({"pos": positions[order]}, np.bincount(owner, minlength=comm.size))["pos"]
    # the requests came back grouped by asking rank, in rank order: answer in the same grouping
    counts = comm.exchange_counts(np.bincount(owner, minlength=comm.size))
    local = asked - my_start
    answers = comm.alltoallv_many({k: v[local] for k, v in columns.items()}, counts)
    out = {}
    for k, v in answers.items():
        back = np.empty_like(v)
        back[order] = v
        out[k] = back
    return out
