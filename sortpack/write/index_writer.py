"""The index directory: move micro-batches to their shard owners and assemble the Arrow tables."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..distribute import move_ragged, redistribute
from ..format.kinds import new_manifest, rows_per_shard, samples_per_shard
from ..format.manifest import DATA_VERSION, VERSION
from ..format.schemas import index_schema, sample_id_type, schema_json
from ..inputs.locations import split_locations
from ..parallel import Comm
from ..partition import index_shard_layout
from ..stages.pack import Microbatches
from .output import PlanDir
from .provenance import JobInfo, Profile, provenance
from .shards import write_owned_shards


def _list_array(offsets: np.ndarray, values: np.ndarray, a: int, b: int, value_type) -> pa.Array:
    lo, hi = int(offsets[a]), int(offsets[b])
    return pa.ListArray.from_arrays(pa.array((offsets[a:b + 1] - lo).astype(np.int32)),
                                    pa.array(values[lo:hi], value_type))


def write_index(comm: Comm, out: PlanDir, mbs: Microbatches, options: dict, files: list[dict],
                profile: Profile, job: JobInfo, store=None, extra: dict | None = None) -> dict | None:
    """Write the index directory from this rank's micro-batches; return the manifest on rank 0.

    ``store`` (a ``write.store.Store`` from ``prepare``) also writes the stored columns' data shards;
    ``extra`` adds manifest keys (a mixture plan's ``mixture``), covered by ``content_hash``.
    """
    rows = rows_per_shard("index")
    m = len(mbs.offsets) - 1
    # shards cut by sample count and dealt by bytes: every rank writes, whatever the sizes
    starts, dest = index_shard_layout(comm, np.diff(mbs.offsets), mbs.first, mbs.total, rows, samples_per_shard())
    ids = move_ragged(comm, mbs.sample_ids, np.diff(mbs.offsets), mbs.first, dest)
    ranges = None
    if mbs.begin is not None and mbs.end is not None:
        # --oversize split: each sample's range in its source sample, moved as its id is
        ranges = {name: move_ragged(comm, v, np.diff(mbs.offsets), mbs.first, dest)
                  for name, v in (("piece_begin", mbs.begin), ("piece_end", mbs.end))}
    row_sizes = None
    if mbs.row_sizes is not None:
        row_sizes = move_ragged(comm, mbs.row_sizes, mbs.columns["batch_size"].astype(np.int64), mbs.first, dest)
    cols = dict(mbs.columns)
    cols["microbatch"] = np.arange(mbs.first, mbs.first + m, dtype=np.int64)
    cols = redistribute(comm, cols, mbs.first, dest)
    offsets = np.concatenate(([0], np.cumsum(cols["num_samples"], dtype=np.int64)))
    source_rows = int(sum(f["rows"] for f in files))
    # the id width follows the input's row count, the same on every rank: bytes never depend on P
    id_type = sample_id_type(source_rows)
    schema = index_schema(rows=row_sizes is not None, id_type=id_type, source="source" in cols,
                          pieces=ranges is not None)
    if row_sizes is not None:
        row_offsets = np.concatenate(([0], np.cumsum(cols["batch_size"], dtype=np.int64)))
        # row_splits of a micro-batch: where each of its rows starts in its sample_ids, plus the end
        row_start_in_mb = np.concatenate(([0], np.cumsum(row_sizes, dtype=np.int64)))
    first = int(dest[comm.rank])

    def make_table(a, b):
        data = {}
        for name in schema.names:
            if name == "sample_ids":
                data[name] = _list_array(offsets, ids, a, b, id_type)
            elif ranges is not None and name in ranges:
                data[name] = _list_array(offsets, ranges[name], a, b, pa.int64())
            elif name == "row_splits":
                # per micro-batch: where each row starts in its sample_ids, then the end
                counts = cols["batch_size"][a:b].astype(np.int64)
                row_starts = row_start_in_mb[int(row_offsets[a]):int(row_offsets[b])]
                rel = row_starts - np.repeat(offsets[a:b], counts)
                values = np.insert(rel, np.cumsum(counts), offsets[a + 1:b + 1] - offsets[a:b])
                list_off = np.concatenate(([0], np.cumsum(counts + 1)))
                data[name] = pa.ListArray.from_arrays(pa.array(list_off.astype(np.int32)),
                                                      pa.array(values.astype(np.int32)))
            else:
                data[name] = pa.array(cols[name][a:b], schema.field(name).type)
        return pa.table(data, schema=schema)

    with profile.stage("write_index"):
        shards = write_owned_shards(comm, out, "index", make_table, first, len(cols["microbatch"]), mbs.total,
                                    rows, samples_in=lambda a, b: offsets[b] - offsets[a], starts=starts)
    data = None
    if store is not None:
        with profile.stage("materialize"):
            data = store(out, files, ids, offsets, first, starts, cols["tokens"], ranges)
    prov = provenance(comm, profile, job)
    files, where = split_locations(files)  # where and when, not what: out of content_hash
    prov.update(where)
    if data is not None:
        prov["exchange"] = data.pop("_exchange", None)
    manifest = new_manifest(
        "index", version=VERSION,
        num_rows=mbs.total, num_samples=mbs.stats["num_samples"], num_microbatches=mbs.total,
        rows_per_shard=rows, samples_per_shard=samples_per_shard(), schema=schema_json(schema), options=options,
        source={"num_rows": source_rows, "files": files},
        shards=shards, stats=mbs.stats, provenance=prov,
    )
    if data is not None:
        manifest.update(version=DATA_VERSION, data=data)
    if extra:
        manifest.update(extra)
    return out.commit(manifest)
