"""What a reader checks before it trusts a shard: where its file is, its Arrow structure, its bytes.

Three levels (docs/guarantees.md gives what each costs):

- names: every file a manifest names is a plain file name inside its directory
  (``check_member_name``, at ``read_manifest``) and is no symlink leading out of it
  (``member_path``, when the file is opened);
- structure: a shard, when it is opened, has the manifest's schema and row count, and its
  offsets (lists, strings, binaries, at any depth) are monotone and inside their buffers,
  so a corrupt file is an error naming the file, never a crash in a later read
  (``check_structure``); an index shard's sample ids are in range and agree with its
  ``num_samples`` and row splits (``check_index_shard``);
- bytes: the file's size against the manifest (``shard_size_error``, the one size check:
  a stat, done whenever a shard is opened, listed or verified, and before any hash, so a
  wrong file is never hashed), then its sha256 (``check_sha256``): the stages do it for
  the directory they read, the reader for every index shard it maps (4 or 8 bytes per
  sample) and, with ``verify="full"``, for the data shards too.

No MPI here: the train-time reader uses it.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import SortpackError, one_line

MANIFEST = "manifest.json"


def check_member_name(directory: str | os.PathLike, name, what: str) -> None:
    """Raise unless ``name`` is a plain file name, so that it resolves inside ``directory``.

    ``what`` says where the manifest names it (``shards[3]``) for the message.
    """
    bad = (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
           or "\0" in name or os.path.isabs(name))
    if bad:
        raise SortpackError(f"{Path(directory) / MANIFEST}: {what} names {name!r}, not a file inside the "
                            f"directory (a manifest may name only files beside it)")


def member_path(directory: str | os.PathLike, name: str) -> Path:
    """Return the path of file ``name`` of ``directory``, refusing a name or symlink that leads outside it."""
    check_member_name(directory, name, "a shard entry")
    path = Path(directory) / name
    if path.is_symlink():
        root = os.path.realpath(directory)
        if os.path.commonpath([os.path.realpath(path), root]) != root:
            raise SortpackError(f"{path}: a symlink to {os.path.realpath(path)}, outside {directory} "
                                f"(a manifest may name only files inside its directory)")
    return path


def file_sha256(path: str | os.PathLike) -> str:
    """Return the hex sha256 of a file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shard_size_error(path: Path, entry: dict) -> str | None:
    """Return the one-line message when a shard file is missing or not the manifest's size (None: it is)."""
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError:
        size = None
    if size is None:
        return f"{path}: shard listed in the manifest is missing"
    if size != int(entry["bytes"]):
        return f"{path}: {size} bytes, the manifest says {entry['bytes']} bytes"
    return None


def check_shard_size(path: Path, entry: dict) -> None:
    """Raise when a shard file is missing or not the size its manifest entry says (a stat, no read)."""
    message = shard_size_error(path, entry)
    if message is not None:
        raise SortpackError(message)


def shard_firsts(directory: str | os.PathLike, entries: list[dict], total: int, what: str) -> list[int]:
    """Return each shard's first row, after checking the shards tile ``[0, total)`` and each file has its size.

    The one check of a shard list a reader opens (the index's shards, its data shards):
    consecutive ``first`` values, ``rows`` summing to ``total``, then a stat per shard
    (``check_shard_size``). ``what`` names the rows in the message ("micro-batches", "rows").
    """
    firsts = [int(e["first"]) for e in entries]
    ends = [first + int(e["rows"]) for first, e in zip(firsts, entries)]
    if ([0] + ends[:-1] if entries else []) != firsts or (ends[-1] if ends else 0) != total:
        raise SortpackError(f"{directory}: manifest shards do not tile its {total} {what}")
    for entry in entries:
        check_shard_size(member_path(directory, entry["file"]), entry)
    return firsts


def check_sha256(path: Path, entry: dict) -> None:
    """Raise when the file's size or sha256 differ from its manifest entry (the size first: no hash of a wrong file)."""
    check_shard_size(path, entry)
    if file_sha256(path) != entry["sha256"]:
        raise SortpackError(f"{path}: sha256 differs from the manifest (the file is corrupt or was modified)")


def check_structure(path: Path, batch: pa.RecordBatch, rows: int, schema: dict | None = None,
                    names: list[str] | None = None) -> None:
    """Raise when a shard's batch disagrees with its manifest or holds offsets outside their buffers.

    ``schema`` (column name to Arrow type string) or ``names`` (column names) is what the
    manifest says; ``rows`` its row count. Costs O(rows) per variable-length column: only
    offsets are read, never the values or string bytes they point to.
    """
    if batch.num_rows != rows:
        raise SortpackError(f"{path}: {batch.num_rows} rows, the manifest says {rows}")
    try:
        fields = [(f.name, str(f.type)) for f in batch.schema]
    except UnicodeDecodeError:  # a flipped byte in the footer's column names
        raise SortpackError(f"{path}: corrupt Arrow shard (a column name in its footer is not UTF-8)") from None
    if schema:
        got = dict(fields)
        if got != dict(schema):
            raise SortpackError(f"{path}: columns {got} differ from the manifest's schema {dict(schema)}")
    if names is not None and [n for n, _ in fields] != list(names):
        raise SortpackError(f"{path}: columns {[n for n, _ in fields]}, the manifest says {list(names)}")
    try:
        batch.validate()  # buffer sizes against lengths: O(columns)
        for name, column in zip(batch.schema.names, batch.columns):
            _check_offsets(column, name)
    except (pa.ArrowException, ValueError) as exc:
        raise SortpackError(f"{path}: corrupt Arrow data ({one_line(exc)})") from None


_OFFSET_TYPES = (
    (pa.types.is_string, np.int32, True), (pa.types.is_binary, np.int32, True),
    (pa.types.is_large_string, np.int64, True), (pa.types.is_large_binary, np.int64, True),
    (pa.types.is_list, np.int32, False), (pa.types.is_large_list, np.int64, False),
    (pa.types.is_map, np.int32, False),
)


def _offsets(arr: pa.Array, dtype) -> np.ndarray:
    buf = arr.buffers()[1]
    n = len(arr) + 1
    if buf is None:
        return np.zeros(1 if len(arr) == 0 else 0, dtype=dtype)
    have = buf.size // np.dtype(dtype).itemsize
    if have < arr.offset + n:
        raise ValueError(f"offsets buffer holds {have} offsets, {arr.offset + n} needed")
    return np.frombuffer(buf, dtype=dtype, count=arr.offset + n)[arr.offset:]


def _check_offsets(arr: pa.Array, name: str) -> None:
    """Raise ValueError when an offset of ``arr`` (or of a nested child) is decreasing or out of bounds."""
    t = arr.type
    for is_type, dtype, flat in _OFFSET_TYPES:
        if is_type(t):
            off = _offsets(arr, dtype)
            if len(off) == 0:
                raise ValueError(f"column {name}: no offsets")
            if len(arr) == 0:
                return
            if flat:
                data = arr.buffers()[2]
                bound = data.size if data is not None else 0
            else:
                bound = len(arr.values)
            if off[0] < 0 or off[-1] > bound or (np.diff(off) < 0).any():
                raise ValueError(f"column {name}: offsets not monotone inside [0, {bound}]")
            if not flat:
                _check_offsets(arr.values, name)
            return
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            _check_offsets(arr.field(i), f"{name}.{t.field(i).name}")
    elif pa.types.is_fixed_size_list(t):
        _check_offsets(arr.values, name)
    elif pa.types.is_dictionary(t) or pa.types.is_union(t) or "view" in str(t) or pa.types.is_run_end_encoded(t):
        arr.validate(full=True)  # rare in sortpack directories: Arrow's own full check
    elif pa.types.is_nested(t):
        arr.validate(full=True)


def check_index_shard(path: Path, batch: pa.RecordBatch, entry: dict, source_rows: int, ids: bool = True) -> None:
    """Raise when an index shard's sample ids or micro-batch columns contradict each other or the manifest.

    A micro-batch's ``num_samples`` is its list's length; row splits start at 0, never
    decrease and end at ``num_samples`` (O(micro-batches)). With ``ids`` also: every sample
    id is an input row in ``[0, source_rows)`` and micro-batch numbers run from the entry's
    ``first`` (O(samples): reads every id). Vectorised.
    """
    column = batch.column("sample_ids")
    off = _offsets(column, np.int64 if pa.types.is_large_list(column.type) else np.int32).astype(np.int64)
    if ids and len(column):
        values = column.values.to_numpy(zero_copy_only=False)[off[0]:off[-1]]
        if values.size and (int(values.min()) < 0 or int(values.max()) >= source_rows):
            bad = int(values[(values < 0) | (values >= source_rows)][0])
            raise SortpackError(f"{path}: sample id {bad} outside the input's rows [0, {source_rows}) "
                                f"(corrupt shard)")
    counts = np.diff(off)
    if "num_samples" in batch.schema.names:
        if not np.array_equal(counts, batch.column("num_samples").to_numpy(zero_copy_only=False)):
            raise SortpackError(f"{path}: a micro-batch's sample ids disagree with its num_samples (corrupt shard)")
    if "num_samples" in entry and int(counts.sum()) != int(entry["num_samples"]):
        raise SortpackError(f"{path}: {int(counts.sum())} sample ids, the manifest says {entry['num_samples']}")
    if ids and "microbatch" in batch.schema.names:
        mb = batch.column("microbatch").to_numpy(zero_copy_only=False)
        if not np.array_equal(mb, np.arange(int(entry["first"]), int(entry["first"]) + len(mb))):
            raise SortpackError(f"{path}: micro-batch numbers do not run from {entry['first']} (corrupt shard)")
    if "row_splits" in batch.schema.names and len(column):
        rs = batch.column("row_splits")
        roff = _offsets(rs, np.int32).astype(np.int64)
        rv = rs.values.to_numpy(zero_copy_only=False).astype(np.int64)[roff[0]:roff[-1]]
        roff = roff - roff[0]
        lens = np.diff(roff)
        ok = bool((lens >= 1).all())
        if ok and "batch_size" in batch.schema.names:
            ok = np.array_equal(lens - 1, batch.column("batch_size").to_numpy(zero_copy_only=False))
        if ok:
            first, last = rv[roff[:-1]], rv[roff[1:] - 1]
            step = np.diff(rv)
            inner = np.ones(len(step), dtype=bool)
            inner[roff[1:-1] - 1] = False  # across two micro-batches' lists
            ok = bool((first == 0).all() and np.array_equal(last, counts) and (step[inner] >= 0).all())
        if not ok:
            raise SortpackError(f"{path}: row splits disagree with the micro-batches' sample ids (corrupt shard)")
