"""The index directory: move micro-batches to their shard owners and assemble the Arrow tables.

The planning half is pure: which rank writes which index shards (``partition.index_shard_cuts``
and ``index_shard_owners``), the micro-batches a rank owns once moved (``owned_microbatches``),
the table of any range of them (``index_table``) and the manifest (``index_manifest``). The
communicating half (``write_index``) moves the micro-batches, writes, stores and commits.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..distribute import move_ragged, redistribute
from ..format.kinds import new_manifest, rows_per_shard, samples_per_shard
from ..format.manifest import DATA_VERSION, VERSION
from ..format.schemas import index_schema, measure_names, sample_id_type, schema_json
from ..inputs.locations import split_locations
from ..parallel import Comm
from ..partition import index_shard_layout
from ..stages.pack import Microbatches
from .output import PlanDir
from .owned import PIECE_COLUMNS, OwnedMicrobatches, PieceRanges, owned_microbatches
from .plan_record import PlanRecord
from .provenance import encoder_provenance, provenance
from .shards import OwnedRows, write_owned_shards

if TYPE_CHECKING:
    from .store import Store, StoreResult

def _list_array(offsets: np.ndarray, values: np.ndarray, a: int, b: int, value_type: pa.DataType) -> pa.Array:
    lo, hi = int(offsets[a]), int(offsets[b])
    return pa.ListArray.from_arrays(pa.array((offsets[a:b + 1] - lo).astype(np.int32)),
                                    pa.array(values[lo:hi], value_type))


def row_splits(owned: OwnedMicrobatches, a: int, b: int) -> pa.Array:
    """Return, per local micro-batch in ``[a, b)``, where each of its rows starts in its sample ids, then the end."""
    assert owned.row_offsets is not None and owned.row_starts is not None, "row_splits needs rows mode"
    counts = owned.columns["batch_size"][a:b].astype(np.int64)
    starts = owned.row_starts[int(owned.row_offsets[a]):int(owned.row_offsets[b])]
    offsets = owned.offsets
    rel = starts - np.repeat(offsets[a:b], counts)
    values = np.insert(rel, np.cumsum(counts), offsets[a + 1:b + 1] - offsets[a:b])
    list_off = np.concatenate(([0], np.cumsum(counts + 1)))
    return pa.ListArray.from_arrays(pa.array(list_off.astype(np.int32)), pa.array(values.astype(np.int32)))


def index_table(owned: OwnedMicrobatches, schema: pa.Schema, a: int, b: int) -> pa.Table:
    """Return local micro-batches ``[a, b)`` as an index table of ``schema``."""
    data = {}
    for name in schema.names:
        type_ = schema.field(name).type
        if name == "sample_ids":
            data[name] = _list_array(owned.offsets, owned.sample_ids, a, b, type_.value_type)
        elif owned.ranges is not None and name in PIECE_COLUMNS:
            data[name] = _list_array(owned.offsets, owned.ranges.column(name), a, b, type_.value_type)
        elif name == "row_splits":
            data[name] = row_splits(owned, a, b)
        else:
            data[name] = pa.array(owned.columns[name][a:b], type_)
    return pa.table(data, schema=schema)


def _move_to_owners(comm: Comm, mbs: Microbatches, dest: np.ndarray) -> OwnedMicrobatches:
    """Return the micro-batches this rank writes, moved from the ranks that packed them (collective)."""
    counts = np.diff(mbs.offsets)
    ids = move_ragged(comm, mbs.sample_ids, counts, mbs.first, dest)
    ranges = None
    if mbs.begin is not None and mbs.end is not None:
        # each sample's range in its source sample, moved as its id is
        ranges = PieceRanges(move_ragged(comm, mbs.begin, counts, mbs.first, dest),
                             move_ragged(comm, mbs.end, counts, mbs.first, dest))
    row_sizes = None
    if mbs.row_sizes is not None:
        row_sizes = move_ragged(comm, mbs.row_sizes, mbs.columns["batch_size"].astype(np.int64), mbs.first, dest)
    cols = dict(mbs.columns)
    cols["microbatch"] = np.arange(mbs.first, mbs.first + len(counts), dtype=np.int64)
    return owned_microbatches(int(dest[comm.rank]), redistribute(comm, cols, mbs.first, dest), ids, ranges,
                              row_sizes)


def index_manifest(mbs: Microbatches, schema: pa.Schema, record: PlanRecord, shards: list[dict], prov: dict) -> dict:
    """Return the index directory's manifest (``with_data`` adds the stored columns' data shards).

    The source files are recorded without their locations: those are in ``prov``, the provenance.
    """
    files, _ = split_locations(record.files)
    manifest = new_manifest(
        "index", version=VERSION,
        num_rows=mbs.total, num_samples=mbs.stats["num_samples"], num_microbatches=mbs.total,
        rows_per_shard=rows_per_shard("index"), samples_per_shard=samples_per_shard(),
        schema=schema_json(schema), options=record.options.to_manifest(),
        source={"num_rows": record.source_rows, "files": files},
        shards=shards, stats=mbs.stats, provenance=prov,
    )
    if record.extra:
        manifest.update(record.extra)
    return manifest


def with_data(manifest: dict, stored: StoreResult) -> dict:
    """Return an index manifest that also records its data shards (``--store``: the format's data version)."""
    return {**manifest, "version": DATA_VERSION, "data": stored.manifest_data()}


def write_index(comm: Comm, out: PlanDir, mbs: Microbatches, record: PlanRecord,
                store: Store | None = None) -> dict | None:
    """Write the index directory from this rank's micro-batches; return the manifest on rank 0.

    ``store`` (from ``write.store.prepare``) also writes the stored columns' data shards;
    ``record.extra`` adds manifest keys (a mixture plan's ``mixture``), covered by ``content_hash``.
    """
    rows = rows_per_shard("index")
    # shards cut by sample count and dealt by bytes: every rank writes, whatever the sizes
    starts, dest = index_shard_layout(comm, np.diff(mbs.offsets), mbs.first, mbs.total, rows, samples_per_shard())
    owned = _move_to_owners(comm, mbs, dest)
    # the id width follows the input's row count, the same on every rank: bytes never depend on P
    schema = index_schema(rows=owned.row_sizes is not None, id_type=sample_id_type(record.source_rows),
                          source="source" in owned.columns, pieces=owned.ranges is not None,
                          attention="attention" in owned.columns, measures=measure_names(owned.columns))
    with record.profile.stage("write_index"):
        mine = OwnedRows(owned.first, owned.count, mbs.total, partial(index_table, owned, schema), owned.samples_in)
        shards = write_owned_shards(comm, out, "index", mine, starts)
    stored = None
    if store is not None:
        with record.profile.stage("materialize"):
            stored = store(out, record.files, owned, starts)
    prov = provenance(comm, record.profile, record.job)
    prov.update(split_locations(record.files)[1])  # where and when, not what: out of content_hash
    # which encoder gave the ids: the same ids either way
    prov.update(encoder_provenance(record.options.to_manifest()))
    if stored is not None:
        # varies with the rank count: in the provenance, out of content_hash
        prov["exchange"] = stored.exchange.as_dict()
    manifest = index_manifest(mbs, schema, record, shards, prov)
    return out.commit(manifest if stored is None else with_data(manifest, stored))
