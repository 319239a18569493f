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
