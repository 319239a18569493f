"""Shard files: atomic output directories, Arrow IPC shards written by their owner ranks,
and reads of global row ranges."""
from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import SortpackError
from ..parallel import Comm
from .manifest import read_manifest, shard_name, write_manifest

ROWS_PER_SHARD = {"metrics": 1 << 20, "sorted": 1 << 20, "index": 1 << 16}
# An index shard also ends where its samples cross a multiple of this count, so the
# shards, and the ranks that write them, follow the samples rather than the micro-batches
# (micro-batches of short samples hold thousands of ids, of long ones a few).
SAMPLES_PER_SHARD = 1 << 20
if os.environ.get("SORTPACK_TEST_SHARD_ROWS"):
    # tests shrink shards to exercise many-shard layouts on small data
    ROWS_PER_SHARD = {k: int(os.environ["SORTPACK_TEST_SHARD_ROWS"]) for k in ROWS_PER_SHARD}
    SAMPLES_PER_SHARD = int(os.environ["SORTPACK_TEST_SHARD_ROWS"])


def shard_starts(total_rows: int, rows_per_shard: int) -> np.ndarray:
    """Return the first global row of every shard, plus ``total_rows`` at the end."""
    n = -(-total_rows // rows_per_shard) if total_rows else 0
    starts = np.arange(n + 1, dtype=np.int64) * rows_per_shard
    starts[-1] = total_rows
    return starts


def owner_starts(total_rows: int, rows_per_shard: int, ranks: int) -> np.ndarray:
    """Return, for each rank, the first global row it owns when ranks own whole shards.

    Shards go to ranks in contiguous blocks as even as whole shards allow, so every
    rank's share is within one shard of even.
    """
    num_shards = -(-total_rows // rows_per_shard) if total_rows else 0
    first_shard = (np.arange(ranks + 1, dtype=np.int64) * num_shards) // ranks
    return np.minimum(first_shard * rows_per_shard, total_rows)


def balanced_blocks(weights: np.ndarray, ranks: int) -> np.ndarray:
    """Return, for each rank, the first item of its contiguous block of items (plus the end).

    Blocks are balanced by weight: an item goes to the rank whose share of the cumulative
    weight holds the item's midpoint.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) == 0:
        return np.zeros(ranks + 1, dtype=np.int64)
    total = weights.sum()
    if total <= 0:
        weights, total = np.ones(len(weights)), float(len(weights))
    mid = np.cumsum(weights) - weights / 2
    owner = np.minimum((mid * ranks / total).astype(np.int64), ranks - 1)
    return np.searchsorted(owner, np.arange(ranks + 1), side="left").astype(np.int64)


def index_shard_layout(comm: Comm, num_samples: np.ndarray, first: int, total: int,
                       rows_per_shard: int, samples_per_shard: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (first micro-batch of every index shard plus the end, first micro-batch each rank writes).

    This rank holds micro-batches ``[first, first + len(num_samples))``. A shard ends after
    the micro-batch in which the running sample count reaches a multiple of
    ``samples_per_shard``, and after every ``rows_per_shard`` micro-batches: boundaries that
    depend on the data only, never on the rank count. Shards then go to ranks in contiguous
    blocks balanced by their bytes (about 8 per sample id plus 48 per micro-batch), so
    every rank writes once there are as many shards as ranks.
    """
    n = np.asarray(num_samples, dtype=np.int64)
    end = np.cumsum(n) + comm.exscan(int(n.sum()))
    start = end - n
    mb = first + np.arange(len(n), dtype=np.int64)
    cut = (end // samples_per_shard > start // samples_per_shard) | ((mb + 1) % rows_per_shard == 0)
    cut &= mb + 1 < total  # the end is added below, once
    cut_mb = comm.allgatherv(mb[cut] + 1)
    cut_samples = comm.allgatherv(end[cut])
    total_samples = comm.allreduce(int(n.sum()), "sum")
    starts = np.concatenate(([0], cut_mb, [total])).astype(np.int64) if total else np.zeros(1, np.int64)
    sample_starts = np.concatenate(([0], cut_samples, [total_samples])).astype(np.int64)
    weights = 8 * np.diff(sample_starts[:len(starts)]) + 48 * np.diff(starts)
    blocks = balanced_blocks(weights, comm.size)
    return starts, starts[np.minimum(blocks, len(starts) - 1)]


class OutputDir:
    """An output directory that appears only when complete.

    Every rank writes into one temporary sibling; ``commit`` has rank 0 write the manifest
    and rename it into place (replacing an old one only with ``overwrite``).
    """

    def __init__(self, comm: Comm, path: str | os.PathLike, overwrite: bool = False):
        self.comm = comm
        self.path = Path(path)
        self.overwrite = overwrite
        err = None
        if comm.is_root():
            if self.path.exists() and not overwrite:
                err = SortpackError(f"{self.path}: output exists (use --overwrite to replace it)")
            elif not self.path.parent.exists():
                err = SortpackError(f"{self.path}: parent directory {self.path.parent} does not exist")
        comm.check(err)
        token = comm.bcast_obj(uuid.uuid4().hex[:12] if comm.is_root() else None)
        self.tmp = self.path.parent / f".{self.path.name}.tmp-{token}"
        self._created = False

    def ensure(self) -> Path:
        """Create the temporary directory (collective) and return it."""
        if not self._created:
            if self.comm.is_root():
                self.tmp.mkdir()
            self.comm.barrier()
            self._created = True
        return self.tmp

    def commit(self, manifest: dict) -> dict | None:
        """Write the manifest and move the directory into place; return the manifest on rank 0."""
        self.ensure()
        self.comm.barrier()
        written = None
        if self.comm.is_root():
            written = write_manifest(self.tmp, manifest)
            old = None
            if self.path.exists():
                old = self.path.parent / f".{self.path.name}.old-{uuid.uuid4().hex[:8]}"
                os.rename(self.path, old)
            os.rename(self.tmp, self.path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        self.comm.barrier()
        return written

    def discard(self) -> None:
        """Remove the temporary directory (rank 0, best effort)."""
        if self.comm.is_root() and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)


def write_shard(path: Path, table: pa.Table) -> dict:
    """Write ``table`` as one-batch Arrow IPC file; return its ``bytes`` and ``sha256``."""
    batch = pa.RecordBatch.from_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                                        for c in table.columns], schema=table.schema)
    with pa.OSFile(str(path), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_batch(batch)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def write_owned_shards(
    comm: Comm,
    out: OutputDir,
    kind: str,
    make_table,
    first_row: int,
    num_rows: int,
    total_rows: int,
    rows_per_shard: int,
    samples_in=None,
    starts: np.ndarray | None = None,
) -> list[dict]:
    """Write this rank's whole shards; return every shard's manifest entry on all ranks.

    This rank holds global rows ``[first_row, first_row + num_rows)``, which must be whole
    shards; ``make_table(a, b)`` returns local rows ``[a, b)`` as a table. Each shard is
    built on its own, so its bytes never depend on how rows were split between ranks.
    ``samples_in(a, b)`` (index only) counts the samples in local rows ``[a, b)``.
    ``starts`` gives the shard boundaries (default: every ``rows_per_shard`` rows).
    """
    directory = out.ensure()
    if starts is None:
        starts = shard_starts(total_rows, rows_per_shard)
    lo = int(np.searchsorted(starts, first_row))
    hi = int(np.searchsorted(starts, first_row + num_rows)) if num_rows else lo
    entries = []
    for k in range(lo, hi):
        a, b = int(starts[k]) - first_row, int(starts[k + 1]) - first_row
        meta = write_shard(directory / shard_name(kind, k), make_table(a, b))
        nsamp = int(samples_in(a, b)) if samples_in is not None else b - a
        entries.append({"file": shard_name(kind, k), "first": int(starts[k]), "rows": b - a,
                        "num_samples": nsamp, **meta})
    gathered = comm.allgather_obj(entries)
    return [e for part in gathered for e in part]


def open_shard(directory: str | os.PathLike, entry: dict) -> pa.RecordBatch:
    """Return the memory-mapped record batch of one shard, checking its size."""
    path = Path(directory) / entry["file"]
    try:
        size = path.stat().st_size
    except OSError:
        raise SortpackError(f"{path}: shard listed in the manifest is missing") from None
    if size != entry["bytes"]:
        raise SortpackError(f"{path}: {size} bytes, the manifest says {entry['bytes']}")
    reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
    if reader.num_record_batches == 1:
        return reader.get_batch(0)
    return pa.Table.from_batches([reader.get_batch(i) for i in range(reader.num_record_batches)],
                                 schema=reader.schema).combine_chunks().to_batches()[0]


def read_rows(directory: str | os.PathLike, manifest: dict, start: int, stop: int,
              columns: list[str] | None = None) -> pa.Table:
    """Return global rows ``[start, stop)`` of a sortpack directory as one table."""
    parts = []
    for entry in manifest["shards"]:
        a, b = entry["first"], entry["first"] + entry["rows"]
        if b <= start or a >= stop:
            continue
        batch = open_shard(directory, entry)
        if columns is not None:
            batch = batch.select(columns)
        lo, hi = max(start, a) - a, min(stop, b) - a
        parts.append(batch.slice(lo, hi - lo))
    if not parts:
        schema = _schema_of(directory, manifest)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        return schema.empty_table()
    return pa.Table.from_batches(parts)


def _schema_of(directory, manifest) -> pa.Schema:
    if manifest["shards"]:
        return open_shard(directory, manifest["shards"][0]).schema
    from .schemas import schema_for

    return schema_for(manifest)


def verify_directory(directory: str | os.PathLike) -> list[str]:
    """Return a list of problems found by re-hashing every shard (empty when all is well)."""
    from .manifest import content_hash

    manifest = read_manifest(directory)
    problems = []
    expected_first = 0
    for entry in manifest["shards"]:
        path = Path(directory) / entry["file"]
        if not path.is_file():
            problems.append(f"{entry['file']}: missing")
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
        if path.stat().st_size != entry["bytes"]:
            problems.append(f"{entry['file']}: {path.stat().st_size} bytes, manifest says {entry['bytes']}")
        if digest.hexdigest() != entry["sha256"]:
            problems.append(f"{entry['file']}: sha256 mismatch")
        if entry["first"] != expected_first:
            problems.append(f"{entry['file']}: starts at row {entry['first']}, expected {expected_first}")
        expected_first = entry["first"] + entry["rows"]
        try:
            rows = open_shard(directory, entry).num_rows
            if rows != entry["rows"]:
                problems.append(f"{entry['file']}: {rows} rows, manifest says {entry['rows']}")
        except Exception as exc:  # noqa: BLE001 - report any unreadable shard as a problem
            problems.append(f"{entry['file']}: unreadable ({exc})")
    if expected_first != manifest["num_rows"]:
        problems.append(f"shards hold {expected_first} rows, manifest says {manifest['num_rows']}")
    if content_hash(manifest) != manifest.get("content_hash"):
        problems.append("manifest content_hash does not match its contents")
    return problems
