"""Metrics and sorted directories: write them from ranks' SampleColumns and read them back into SampleColumns."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..distribute import redistribute
from ..errors import SortpackError
from ..format.kinds import new_manifest, rows_per_shard
from ..format.manifest import VERSION, read_manifest
from ..format.schemas import kind_schema, measure_names, schema_json
from ..format.shards import check_shards, read_rows
from ..inputs.locations import split_locations, with_locations
from ..parallel import Comm
from ..partition import owner_starts, shard_starts
from ..stages.plan_options import PlanOptions
from ..stages.samples import SampleColumns, sample_stats
from .output import OutputDir
from .plan_record import PlanRecord
from .provenance import encoder_provenance, provenance
from .shards import OwnedRows, write_owned_shards


def write_samples(comm: Comm, out: OutputDir, kind: str, samples: SampleColumns, record: PlanRecord) -> dict | None:
    """Write a metrics or sorted directory from this rank's slice; return the manifest on rank 0."""
    return out.commit(_write_shards(comm, out, kind, samples, record))


def write_sample_shards(comm: Comm, out: OutputDir, kind: str, samples: SampleColumns, record: PlanRecord) -> dict:
    """Write the shards of a metrics or sorted directory from this rank's slice; return its manifest (every rank).

    Nothing is committed: once every rank has returned, any one rank may ``out.commit`` or
    ``out.commit_alone`` it (``run`` keeps its measurements on failure).
    """
    manifest = _write_shards(comm, out, kind, samples, record)
    comm.barrier()  # every shard is on disk: any one rank may commit from here on
    return manifest


def _write_shards(comm: Comm, out: OutputDir, kind: str, samples: SampleColumns, record: PlanRecord) -> dict:
    """Return the manifest of a metrics or sorted directory after writing this rank's shards."""
    rows = rows_per_shard(kind)
    dest = owner_starts(samples.total, rows, comm.size)
    cols = redistribute(comm, samples.columns(), samples.start, dest)
    cols.setdefault("difficulty", cols["size"])
    first = int(dest[comm.rank])
    diff_type = pa.float64() if cols["difficulty"].dtype.kind == "f" else pa.int64()
    schema = kind_schema(kind, diff_type, pieces="begin" in cols, measures=measure_names(samples.measures))
    if kind == "sorted" and "stage" not in cols:
        cols["stage"] = np.zeros(len(cols["sample_id"]), np.int16)

    def make_table(a: int, b: int) -> pa.Table:
        return pa.table({name: cols[name][a:b] for name in schema.names}, schema=schema)

    with record.profile.stage(f"write_{kind}"):
        mine = OwnedRows(first, len(cols["sample_id"]), samples.total, make_table)
        shards = write_owned_shards(comm, out, kind, mine, shard_starts(samples.total, rows))
    stats = sample_stats(comm, samples)
    prov = provenance(comm, record.profile, record.job)
    files, where = split_locations(record.files)  # where and when, not what: out of content_hash
    prov.update(where)
    recorded = record.options.to_manifest()
    prov.update(encoder_provenance(recorded))  # which encoder gave the ids: the same ids either way
    manifest = new_manifest(
        kind, version=VERSION,
        num_rows=samples.total, num_samples=samples.total, rows_per_shard=rows,
        schema=schema_json(schema), options=recorded,
        source={"num_rows": samples.total, "files": files},
        shards=shards, stats=stats, provenance=prov,
    )
    return manifest


def read_samples(comm: Comm, directory: str, expect: str) -> tuple[SampleColumns, PlanOptions]:
    """Return this rank's shard-aligned slice of a metrics or sorted directory, and the options it records."""
    manifest = comm.collectively(read_manifest, directory, expect)
    total = manifest["num_rows"]
    starts = owner_starts(total, manifest["rows_per_shard"], comm.size)
    a, b = int(starts[comm.rank]), int(starts[comm.rank + 1])
    # a flipped bit in a shard must stop the job here, not become a clean-looking output
    err = None
    try:
        check_shards(directory, manifest, a, b)
    except SortpackError as exc:
        err = exc
    comm.check(err)
    table = read_rows(directory, manifest, a, b)
    cols = {name: table.column(name).to_numpy() for name in table.column_names}
    options = PlanOptions.from_manifest(manifest["options"])
    samples = SampleColumns(a, total, cols["sample_id"].astype(np.int64), cols["size"].astype(np.int64),
                            cols["difficulty"], cols.get("stage"), with_locations(manifest), options.empty_size,
                            cols.get("begin"), {name: cols[name].astype(np.int64) for name in measure_names(cols)})
    return samples, options
