"""``sortpack export PLAN --to packed-parquet``: a ``--rows`` plan as the packed fine-tuning file NeMo and
Megatron-Bridge read.

One Parquet row per packed row of the plan, in plan order (micro-batches in order, their rows
in order), with the columns of Megatron-Bridge's ``GPTSFTPackedParquetDataset``
(``megatron/bridge/data/packing/parquet.py``; NeMo's packed ``.npy`` holds the same keys):

- ``input_ids`` (list<int64>): the row's documents one after another;
- ``seq_start_id`` (list<int64>): where each document starts in the row;
- ``loss_mask`` (list<int8>): 1 where the token that follows in the same document is a loss
  target (its stored label is not -100; every token of a plan without labels), 0 at each
  document's last token. This is the mask ``fill_packing_strategy`` writes (the answer mask
  rolled by one within each document), which the readers' collate pairs with the label
  ``input_ids[t + 1]`` of input position ``t``.

The types are what Bridge's ``write_packed_parquet`` gives (Python ints become int64, its
``loss_mask`` is int8), in row groups of 500 rows as it writes them. Rank 0 writes the file
(a Parquet file has one writer); its bytes depend on the plan alone.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import SortpackError
from ...parallel import Comm
from .plan_tokens import Chunk, PlanTokens

ROW_GROUP = 500  # Megatron-Bridge's write_packed_parquet default
CHUNK_MICROBATCHES = 4096  # micro-batches read at once
IGNORE = -100
MARK = {b"sortpack": b"packed-parquet"}  # in the file's metadata: what --overwrite may replace
SCHEMA = pa.schema([pa.field("input_ids", pa.list_(pa.int64())), pa.field("loss_mask", pa.list_(pa.int8())),
                    pa.field("seq_start_id", pa.list_(pa.int64()))], metadata=MARK)


def loss_mask(labels: np.ndarray | None, offsets: np.ndarray) -> np.ndarray:
    """Return the int8 loss mask of documents at ``offsets`` (from 0): 1 where the next token of the same document
    is a target (``labels`` not -100; every one without labels), 0 at each document's last token."""
    total = int(offsets[-1])
    mask = np.ones(total, dtype=np.int8) if labels is None else np.zeros(total, dtype=np.int8)
    if labels is not None and total > 1:
        mask[:-1] = labels[1:] != IGNORE
    ends = offsets[1:][np.diff(offsets) > 0]
    mask[ends - 1] = 0
    return mask


def packed_rows(chunk: Chunk) -> pa.Table:
    """Return the packed rows of a chunk of a ``--rows`` plan as a table of ``SCHEMA``."""
    assert chunk.row_sizes is not None
    offsets = chunk.offsets
    row_doc = np.concatenate(([0], np.cumsum(chunk.row_sizes)))  # each row's first document, then the end
    row_tok = offsets[row_doc]
    ids = pa.ListArray.from_arrays(pa.array((row_tok - row_tok[0]).astype(np.int32)),
                                   pa.array(chunk.values.astype(np.int64)))
    mask = pa.ListArray.from_arrays(pa.array((row_tok - row_tok[0]).astype(np.int32)),
                                    pa.array(loss_mask(chunk.labels, offsets - offsets[0])))
    doc_row = np.repeat(np.arange(len(chunk.row_sizes)), chunk.row_sizes)
    starts = offsets[:-1] - row_tok[doc_row]
    seq = pa.ListArray.from_arrays(pa.array(row_doc.astype(np.int32)), pa.array(starts.astype(np.int64)))
    return pa.Table.from_arrays([ids, mask, seq], schema=SCHEMA)


def _write_all(plan: PlanTokens, path: Path) -> int:
    """Write every packed row of the plan to ``path`` in row groups of ``ROW_GROUP``; return the row count."""
    held: list[pa.Table] = []
    rows, at = 0, 0
    plan.check(0, plan.num_microbatches)  # the index shards, hashed once before the first write
    plan.hold(0, plan.num_microbatches)
    plan.hold_rows(0, int(plan.manifest["num_samples"]))
    with pq.ParquetWriter(str(path), SCHEMA) as writer:
        for lo in range(0, plan.num_microbatches, CHUNK_MICROBATCHES):
            hi = min(plan.num_microbatches, lo + CHUNK_MICROBATCHES)
            chunk = plan.read(lo, hi, at)
            at += int(chunk.num_samples.sum())
            held.append(packed_rows(chunk))
            table = pa.concat_tables(held)
            whole = table.num_rows - table.num_rows % ROW_GROUP
            if whole:
                writer.write_table(table.slice(0, whole), row_group_size=ROW_GROUP)
                rows += whole
            held = [table.slice(whole)]
        table = pa.concat_tables(held)
        if table.num_rows or not rows:
            writer.write_table(table, row_group_size=ROW_GROUP)
            rows += table.num_rows
    return rows


def check_rows(plan: PlanTokens) -> None:
    """Raise one line unless the plan packs rows (``--rows``): what a packed file holds."""
    if not plan.has_rows:
        raise SortpackError(f"{plan.path}: not a --rows plan; --to packed-parquet writes packed rows (plan with "
                            "--rows ROW_LEN), --to megatron writes any plan")


def write_packed_parquet(comm: Comm, plan: PlanTokens, path: Path) -> dict:
    """Write the ``--rows`` plan as packed rows to ``path`` (rank 0; collective); return the rows written."""

    def write() -> int:
        try:
            return _write_all(plan, path) if comm.is_root() else 0
        except OSError as exc:
            raise SortpackError(f"{path}: cannot write the export ({exc.strerror or exc})") from None

    return {"rows": int(comm.allreduce(comm.collectively(write), "sum"))}


def is_packed_parquet(path: Path) -> str | None:
    """Return why an existing ``path`` may not be replaced by this export (None: a packed file sortpack wrote)."""
    try:
        meta = pq.read_schema(str(path)).metadata or {}
    except (OSError, pa.ArrowException):
        return "is not a Parquet file"
    return None if meta.get(b"sortpack") == MARK[b"sortpack"] else "is a Parquet file sortpack did not write"
