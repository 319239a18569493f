"""Arrow IPC shards written by their owner ranks, so a shard's bytes never depend on the rank count."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import SortpackError
from ..format.integrity import file_sha256
from ..format.manifest import shard_name
from ..parallel import Comm, fault_point
from ..progress import Progress
from .output import PlanDir


def write_shard(path: Path, table: pa.Table) -> dict:
    """Write ``table`` as one-batch Arrow IPC file; return its ``bytes`` and ``sha256``."""
    batch = pa.RecordBatch.from_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                                        for c in table.columns], schema=table.schema)
    with pa.OSFile(str(path), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_batch(batch)
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


@dataclass(frozen=True)
class OwnedRows:
    """The global rows ``[first, first + count)`` of ``total`` that one rank writes, as tables of local rows.

    ``make_table(a, b)`` returns local rows ``[a, b)``; ``samples_in(a, b)`` (index only) counts
    the samples in them (None: one sample a row).
    """

    first: int
    count: int
    total: int
    make_table: Callable[[int, int], pa.Table]
    samples_in: Callable[[int, int], int] | None = None


def write_owned_shards(comm: Comm, out: PlanDir, kind: str, rows: OwnedRows, starts: np.ndarray) -> list[dict]:
    """Write this rank's whole shards; return every shard's manifest entry on all ranks.

    ``rows`` must be whole shards of ``starts`` (each shard's first global row, then the end:
    ``partition.shard_starts`` cuts every ``rows_per_shard`` rows). Each shard is built on its
    own, so its bytes never depend on how rows were split between ranks.
    """
    first_row, num_rows, total_rows = rows.first, rows.count, rows.total
    make_table, samples_in = rows.make_table, rows.samples_in
    directory = out.ensure()
    lo = int(np.searchsorted(starts, first_row))
    hi = int(np.searchsorted(starts, first_row + num_rows)) if num_rows else lo
    entries = []
    prog = Progress(f"write {kind}", num_rows, "micro-batches" if kind == "index" else "rows", job_total=total_rows)
    err = None
    for k in range(lo, hi):
        a, b = int(starts[k]) - first_row, int(starts[k + 1]) - first_row
        try:
            meta = write_shard(directory / shard_name(kind, k), make_table(a, b))
        except OSError as exc:  # a full disk, a quota, a file size limit: every rank stops together
            err = SortpackError(f"{out.path}: cannot write {shard_name(kind, k)} "
                                f"({exc.strerror or ' '.join(str(exc).split())})")
            break
        prog.update(b - a)
        nsamp = int(samples_in(a, b)) if samples_in is not None else b - a
        entries.append({"file": shard_name(kind, k), "first": int(starts[k]), "rows": b - a,
                        "num_samples": nsamp, **meta})
    prog.close()
    fault_point(comm, f"wrote_{kind}")
    comm.check(err)
    gathered = comm.allgather_obj(entries)
    return [e for part in gathered for e in part]
