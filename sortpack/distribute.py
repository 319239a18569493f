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
    cuts = np.clip(np.asarray(dest_starts, dtype=np.int64) - my_start, 0, n)
    return comm.alltoallv_many(columns, np.diff(cuts))


def global_start(comm: Comm, n: int) -> tuple[int, int]:
    """Return (first global position of this rank's n rows, total rows over ranks)."""
    start = comm.exscan(n)
    return start, comm.allreduce(int(n), "sum")
