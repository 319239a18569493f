"""What a plan records of each input file so that a later stage can tell the file changed.

Each entry of a manifest's ``source.files`` holds the format, rows and bytes, and a
content digest: ``sha256`` of what ``sha256_of`` names (the format's ``InputFormat.digest``
and ``footer_magic`` say which):

- ``file`` (JSONL, CSV): the whole file. Analyze parses every byte of a text file anyway;
  hashing it too costs a fraction of that parse (docs/guarantees.md has the figures), and
  it is the one fingerprint that sees a same-size edit anywhere (two lines swapped).
- ``footer`` (Parquet, Arrow IPC files): the file's footer (Parquet's FileMetaData, Arrow's
  Footer): schema, row groups or batches with their offsets, sizes and statistics.
  Reading it costs one small read whatever the file's size; a whole-file hash would cost
  more than analyzing a column of sizes.
- ``ends`` (Arrow IPC streams, which have no footer): the first and last 64 KiB.

Where a file lies and when it was written say nothing of what it holds: they are kept out
of ``content_hash``, so the same data gives the same plan wherever it was read from (a
local copy, another directory, an ``s3://`` or ``gs://`` object): ``provenance`` holds,
one per file in ``source.files`` order, ``source_paths`` (the path or URL),
``source_mtime_ns`` (the file's mtime, the object's Last-Modified) and, for objects,
``source_etags`` (S3's ETag or GCS's generation, from the request that opens it). In memory the
entries carry them as ``path``, ``mtime_ns`` and ``etag``; ``locations.split_locations`` and
``locations.with_locations`` move them to and from the provenance when a manifest is written and
read (a manifest written before keeps ``path`` in its entries, and reads the same).

``check_unchanged`` is what ``pack --store`` (and ``run --store``) call before reading an
input again: size, version, digest and rows must all agree. The version is the mtime of a
local file and the ETag (generation) of an object; a file whose whole content hash agrees
is accepted with a new version (touched, copied or uploaded again, not changed).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from ..errors import SortpackError, one_line
from ..parallel import Comm
from ..partition import owned
from . import objects
from .formats import reader_for

ENDS = 1 << 16  # bytes hashed at each end of a file without a footer
_CHUNK = 1 << 22


def content_digest(path: str, fmt: str, size: int) -> dict:
    """Return ``{"sha256": hex, "sha256_of": "file" | "footer" | "ends"}`` of one input file."""
    digest = hashlib.sha256()
    reader = reader_for(fmt)
    # a local file through Python's buffered reads; an object through ranged GETs
    with (objects.open_input(path) if objects.is_url(path) else open(path, "rb")) as fh:
        if reader.digest == "file":
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                digest.update(chunk)
            return {"sha256": digest.hexdigest(), "sha256_of": "file"}
        footer = reader.footer_length(fh, size)
        if footer is not None:
            fh.seek(size - footer)
            digest.update(fh.read(footer))
            return {"sha256": digest.hexdigest(), "sha256_of": "footer"}
        digest.update(size.to_bytes(8, "little"))
        digest.update(fh.read(min(size, ENDS)))
        if size > ENDS:
            fh.seek(max(ENDS, size - ENDS))
            digest.update(fh.read())
        return {"sha256": digest.hexdigest(), "sha256_of": "ends"}


def record(comm: Comm, paths: list[str], formats: list[str], sizes: list[int], owners: np.ndarray) -> list[dict]:
    """Return each file's ``mtime_ns`` and content digest (every rank); file i is read by rank ``owners[i]``.

    The owner (``partition.unit_owners``) is a rank that analyzes the file's first unit, so a
    text file (one unit, never cut) is hashed by the rank that then parses it (from the page
    cache). The mtime is taken before the digest: a file changed while it is read then shows
    a newer mtime than the recorded one.
    """
    mine, err = [], None
    objects.prefetch([paths[i] for i in owned(owners, rank=comm.rank)])  # small objects: kept from here on
    try:
        for i in owned(owners, rank=comm.rank):
            mine.append((i, {**version(paths[i]), **content_digest(paths[i], formats[i], int(sizes[i]))}))
    except SortpackError as exc:
        err = exc
    except OSError as exc:
        err = objects.object_error(paths[i], exc) if objects.is_url(paths[i]) else \
            SortpackError(f"{paths[i]}: cannot read ({one_line(exc)})")
    comm.check(err)
    found = dict(pair for part in comm.allgather_obj(mine) for pair in part)
    return [found[i] for i in range(len(paths))]


def version(path: str) -> dict:
    """Return what says which version of a file was read: ``mtime_ns``, and ``etag`` for an object."""
    if not objects.is_url(path):
        return {"mtime_ns": int(os.stat(path).st_mtime_ns)}
    info = objects.head(path)
    out: dict = {}
    if info.mtime_ns is not None:
        out["mtime_ns"] = info.mtime_ns
    if info.etag is not None:
        out["etag"] = info.etag
    return out


def check_unchanged(entry: dict, size: int, rows: int | None) -> None:
    """Raise one line when an input file differs from its manifest entry (``rows``: None when unknown)."""
    path = entry["path"]
    if size != int(entry["bytes"]):
        raise SortpackError(f"{path}: {size} bytes, the plan was analyzed from {entry['bytes']} bytes "
                            "(the input changed since analyze)")
    now_version = version(path)
    if entry.get("etag") is not None:  # an object: its ETag (generation) names the version, not its time
        moved = now_version.get("etag") != entry["etag"]
        what = f"ETag {now_version.get('etag')}, the plan recorded {entry['etag']}"
    else:
        mtime = now_version.get("mtime_ns")
        moved = entry.get("mtime_ns") is not None and mtime != int(entry["mtime_ns"])
        what = f"mtime {mtime} ns, the plan recorded {entry.get('mtime_ns')}"
    if moved and entry.get("sha256_of") != "file":
        raise SortpackError(f"{path}: modified since analyze ({what}); analyze it again")
    if entry.get("sha256"):
        now = content_digest(path, entry["format"], size)
        if now["sha256"] != entry["sha256"] or now["sha256_of"] != entry.get("sha256_of"):
            raise SortpackError(f"{path}: content changed since analyze (the sha256 of its "
                                f"{entry.get('sha256_of', 'content')} differs); analyze it again")
    if rows is not None and rows != int(entry["rows"]):
        raise SortpackError(f"{path}: {rows} rows, the plan was analyzed from {entry['rows']} rows "
                            "(the input changed since analyze)")
