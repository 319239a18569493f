"""Write a rank's block of data shards from the rows it received, hashing each while the next is written."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from ...errors import SortpackError, one_line
from ...format.data_shards import data_shard_name, write_data_shard
from ...format.integrity import file_sha256
from ...parallel import Comm
from .layout import DataLayout
from .spill import ReceivedRows


def write_data_shards(comm: Comm, directory: Path, received: ReceivedRows, layout: DataLayout) -> list[dict]:
    """Return every data shard's manifest entry (every rank), after writing this rank's block of them."""
    bounds = layout.bounds
    lo, hi = int(layout.writer_starts[comm.rank]), int(layout.writer_starts[comm.rank + 1])
    w0, n = int(bounds[lo, 0]), int(bounds[hi, 0] - bounds[lo, 0])
    all_pos = np.concatenate(received.pos) if received.pos else np.zeros(0, np.int64)
    if len(all_pos) != n or (n and not np.array_equal(np.sort(all_pos), w0 + np.arange(n))):
        raise RuntimeError(f"materialize: rank {comm.rank} received {len(all_pos)} rows for {n} positions")
    where = np.empty(n, dtype=np.int64)
    where[all_pos - w0] = np.arange(n)
    out: list[dict] = []
    hashes: list[Future[str]] = []
    err = None
    # sha256 of a written shard runs in a thread (hashlib releases the GIL) while the next
    # shard is gathered and written
    hasher = ThreadPoolExecutor(max_workers=1)
    try:
        for k in range(lo, hi):
            (r0, mb0), (r1, mb1) = (int(v) for v in bounds[k]), (int(v) for v in bounds[k + 1])
            r0, r1 = r0 - w0, r1 - w0
            name = data_shard_name(k)
            try:
                table = received.gather(where[r0:r1])
            except OverflowError as exc:
                raise SortpackError(f"{directory.parent / name}: a stored column holds too many bytes for one "
                                    f"shard ({exc}); store it as large_string/large_binary") from None
            try:
                size = write_data_shard(directory / name, table)
            except (OSError, pa.ArrowException) as exc:
                raise SortpackError(f"{directory.parent / name}: cannot write the data shard "
                                    f"({one_line(exc)})") from None
            del table
            received.release_below(w0 + r1)
            out.append({"file": name, "first": w0 + r0, "rows": r1 - r0, "first_microbatch": mb0,
                        "microbatches": mb1 - mb0, "bytes": size, "sha256": None})
            hashes.append(hasher.submit(file_sha256, directory / name))
        for entry, digest in zip(out, hashes):
            entry["sha256"] = digest.result()
    except SortpackError as exc:
        err, out = exc, []
    finally:
        hasher.shutdown(wait=True)
    comm.check(err)
    return [e for part in comm.allgather_obj(out) for e in part]
