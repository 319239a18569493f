"""Shard files as read: one shard memory-mapped and checked, global row ranges, whole-directory verification."""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from ..errors import SortpackError, one_line
from .integrity import (
    MANIFEST,
    check_index_shard,
    check_sha256,
    check_shard_size,
    check_structure,
    file_sha256,
    member_path,
    shard_size_error,
)
from .manifest import content_hash, read_manifest
from .schemas import schema_for


def open_shard(directory: str | os.PathLike, entry: dict, schema: dict | None = None,
               names: list[str] | None = None) -> pa.RecordBatch:
    """Return the memory-mapped record batch of one shard, checking its place, size and Arrow structure.

    ``schema`` (name to type string) or ``names`` is what the manifest says of its columns;
    see ``integrity.check_structure`` for what is checked (O(rows), offsets only).
    """
    path = member_path(directory, entry["file"])
    check_shard_size(path, entry)
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        if reader.num_record_batches == 1:
            batch = reader.get_batch(0)
        else:
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            for b in batches:  # each part is checked before concatenating reads its offsets
                check_structure(path, b, b.num_rows)
            if not batches:
                batch = pa.RecordBatch.from_pylist([], schema=reader.schema)
            else:
                batch = pa.Table.from_batches(batches, schema=reader.schema).combine_chunks().to_batches()[0]
    except (pa.ArrowException, OSError, IndexError, UnicodeDecodeError) as exc:
        raise SortpackError(f"{path}: unreadable Arrow shard ({one_line(exc)})") from None
    check_structure(path, batch, int(entry["rows"]), schema, names)
    return batch


def read_rows(directory: str | os.PathLike, manifest: dict, start: int, stop: int,
              columns: list[str] | None = None) -> pa.Table:
    """Return global rows ``[start, stop)`` of a sortpack directory as one table.

    Each shard read is checked against the manifest (``open_shard``; an index shard's ids
    and counts too, ``integrity.check_index_shard``), not hashed: ``verify_shards`` does that.
    """
    parts = []
    for entry in manifest["shards"]:
        a, b = entry["first"], entry["first"] + entry["rows"]
        if b <= start or a >= stop:
            continue
        batch = open_shard(directory, entry, manifest.get("schema"))
        _check_rows(directory, manifest, entry, batch)
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


def _check_rows(directory, manifest: dict, entry: dict, batch: pa.RecordBatch) -> None:
    """Raise when a shard's sample ids leave the input's rows (or, in an index, contradict its counts)."""
    path = Path(directory) / entry["file"]
    source_rows = int((manifest.get("source") or {}).get("num_rows", manifest["num_samples"]))
    if "sample_ids" in batch.schema.names:
        check_index_shard(path, batch, entry, source_rows)
    elif "sample_id" in batch.schema.names and batch.num_rows:
        ids = batch.column("sample_id").to_numpy()
        if int(ids.min()) < 0 or int(ids.max()) >= source_rows:
            raise SortpackError(f"{path}: a sample id outside the input's rows [0, {source_rows}) (corrupt shard)")


def _schema_of(directory, manifest) -> pa.Schema:
    if manifest["shards"]:
        return open_shard(directory, manifest["shards"][0]).schema
    return schema_for(manifest)


def verify_directory(directory: str | os.PathLike) -> list[str]:
    """Return a list of problems found by re-hashing every shard (empty when all is well)."""
    manifest = read_manifest(directory)

    def open_checked(entry: dict) -> None:
        # e.g. an index's sample ids: int32 or int64, as the manifest's schema records
        _check_rows(directory, manifest, entry, open_shard(directory, entry, manifest.get("schema")))

    problems, rows = verify_shard_files(directory, manifest["shards"], open_checked)
    if rows != manifest["num_rows"]:
        problems.append(f"shards hold {rows} rows, manifest says {manifest['num_rows']}")
    if content_hash(manifest) != manifest.get("content_hash"):
        problems.append("manifest content_hash does not match its contents")
    return problems + verify_data(directory, manifest) + _verify_holdout(directory, manifest)


def _verify_holdout(directory: str | os.PathLike, manifest: dict) -> list[str]:
    """Return the problems of the held-out plan a training plan records (none without one).

    The held-out plan is verified as a directory of its own, and its manifest must be the one
    the training plan recorded (its ``content_hash``), so neither plan can be swapped alone.
    """
    record = manifest.get("holdout")
    if record is None:
        return []
    name = record.get("directory") if isinstance(record, dict) else None
    if not isinstance(name, str):
        return ["manifest 'holdout' names no directory"]
    try:
        path = member_path(directory, name)
    except SortpackError as exc:
        return [f"holdout: {one_line(exc)}"]
    if path.is_symlink() or not path.is_dir():
        return [f"{name}/: the held-out plan is missing"]
    try:
        held = read_manifest(path, expect="index")
        problems = [f"{name}/{p}" for p in verify_directory(path)]
    except SortpackError as exc:
        return [f"{name}/: {one_line(exc)}"]
    if held.get("content_hash") != record.get("content_hash"):
        problems.append(f"{name}/: its content_hash {str(held.get('content_hash'))[:16]} is not the one the training "
                        f"plan recorded ({str(record.get('content_hash'))[:16]})")
    counts = [s.get("held_out") for s in record.get("sources", [])]
    held_counts = [s.get("held_out") for s in (held.get("held_out") or {}).get("sources", [])]
    if counts != held_counts:
        problems.append(f"{name}/: holds out {held_counts} samples per source, the training plan says {counts}")
    return problems


def verify_shard_files(directory: str | os.PathLike, entries: list[dict], open_checked) -> tuple[list[str], int]:
    """Return (problems, rows tiled) of a manifest's shard entries: names, tiling, sizes, sha256, structure.

    The one check of a shard set, for the index, metrics and sorted shards and for data
    shards alike. ``open_checked(entry)`` opens one shard and raises on a bad structure. A
    shard whose size already disagrees is not hashed (it may be a huge sparse file).
    """
    problems: list[str] = []
    expected = 0
    for entry in entries:
        try:
            path = member_path(directory, entry["file"])
        except SortpackError as exc:
            problems.append(f"{entry['file']}: {one_line(exc)}")
            continue
        if not path.is_file():
            problems.append(f"{entry['file']}: missing")
            continue
        if entry["first"] != expected:
            problems.append(f"{entry['file']}: starts at row {entry['first']}, expected {expected}")
        expected = entry["first"] + entry["rows"]
        wrong_size = shard_size_error(path, entry)
        if wrong_size is not None:
            problems.append(f"{entry['file']}: {wrong_size.removeprefix(str(path) + ': ')}")
            continue
        if file_sha256(path) != entry["sha256"]:
            problems.append(f"{entry['file']}: sha256 mismatch")
        try:
            open_checked(entry)
        except SortpackError as exc:
            problems.append(f"{entry['file']}: {one_line(exc).removeprefix(str(path) + ': ')}")
        except Exception as exc:  # noqa: BLE001 - report any unreadable shard as a problem
            problems.append(f"{entry['file']}: unreadable ({exc})")
    return problems, expected


def check_shards(directory: str | os.PathLike, manifest: dict, start: int, stop: int) -> None:
    """Raise unless every shard holding a row of ``[start, stop)`` has its manifest's size and sha256.

    What a stage calls on the part of its input directory that this rank reads, before it
    writes anything; with the manifest's own ``content_hash``, so an edited manifest is
    refused too.
    """
    if content_hash(manifest) != manifest.get("content_hash"):
        raise SortpackError(f"{Path(directory) / MANIFEST}: content_hash does not match the manifest "
                            f"(edited or corrupt)")
    for entry in manifest["shards"]:
        first, rows = int(entry["first"]), int(entry["rows"])
        if first + rows <= start or first >= stop:
            continue
        check_sha256(member_path(directory, entry["file"]), entry)


def verify_data(directory, manifest: dict) -> list[str]:
    """Return the problems of an index's data shards (sha256, bytes, rows, tiling); empty when fine."""
    data = manifest.get("data")
    if not data:
        return []
    problems, rows = verify_shard_files(
        directory, data["shards"], lambda entry: open_shard(directory, entry, data.get("schema"), data["columns"]))
    if rows != data["num_rows"] or data["num_rows"] != manifest["num_samples"]:
        problems.append(f"data shards hold {rows} rows, manifest says {data['num_rows']} "
                        f"for {manifest['num_samples']} samples")
    return problems
