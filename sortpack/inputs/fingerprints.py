"""What a plan records of each input file so that a later stage can tell the file changed.

Each entry of a manifest's ``source.files`` holds the path, format, rows and bytes, and a
content digest: ``sha256`` of what ``sha256_of`` names:

- ``file`` (JSONL, CSV): the whole file. Analyze parses every byte of a text file anyway;
  hashing it too costs a fraction of that parse (docs/guarantees.md has the figures), and
  it is the one fingerprint that sees a same-size edit anywhere (two lines swapped).
- ``footer`` (Parquet, Arrow IPC files): the file's footer (Parquet's FileMetaData, Arrow's
  Footer): schema, row groups or batches with their offsets, sizes and statistics.
  Reading it costs one small read whatever the file's size; a whole-file hash would cost
  more than analyzing a column of sizes.
- ``ends`` (Arrow IPC streams, which have no footer): the first and last 64 KiB.

The file's ``mtime_ns`` is recorded too, but it says when, not what: it is kept out of
``content_hash`` (identical files give identical plans, however they were copied), in
``provenance.source_mtime_ns`` (one per file, in ``source.files`` order). In memory the
entries carry it as ``mtime_ns``; ``split_mtimes`` and ``with_mtimes`` move it to and from
the provenance when a manifest is written and read.

``check_unchanged`` is what ``pack --store`` (and ``run --store``) call before reading an
input again: size, mtime, digest and rows must all agree, except that a file whose whole
content hash agrees is accepted with a new mtime (touched or copied, not changed).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from ..errors import SortpackError, one_line
from ..parallel import Comm

ENDS = 1 << 16  # bytes hashed at each end of a file without a footer
_CHUNK = 1 << 22


def content_digest(path: str, fmt: str, size: int) -> dict:
    """Return ``{"sha256": hex, "sha256_of": "file" | "footer" | "ends"}`` of one input file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if fmt in ("jsonl", "csv"):
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                digest.update(chunk)
            return {"sha256": digest.hexdigest(), "sha256_of": "file"}
        footer = _footer_length(fh, fmt, size)
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


def _footer_length(fh, fmt: str, size: int) -> int | None:
    """Return the bytes at the end of the file that hold its footer (with its length and magic), or None."""
    magic, tail = {"parquet": (b"PAR1", 8), "arrow": (b"ARROW1", 10)}.get(fmt, (None, 0))
    if magic is None or size < tail:
        return None
    fh.seek(size - tail)
    end = fh.read(tail)
    if not end.endswith(magic):
        return None  # an Arrow stream, or a file this reader would refuse anyway
    length = int.from_bytes(end[:4], "little", signed=True)
    if length <= 0 or length + tail > size:
        return None
    return length + tail


def record(comm: Comm, paths: list[str], formats: list[str], sizes: list[int], owners: np.ndarray) -> list[dict]:
    """Return each file's ``mtime_ns`` and content digest (every rank); file i is read by rank ``owners[i]``.

    The owner is the rank that analyzes the file's first rows, so a text file is hashed by
    the rank that then parses it (from the page cache). The mtime is taken before the
    digest: a file changed while it is read then shows a newer mtime than the recorded one.
    """
    mine, err = [], None
    try:
        for i in np.flatnonzero(np.asarray(owners) == comm.rank).tolist():
            mtime = os.stat(paths[i]).st_mtime_ns
            mine.append((i, {"mtime_ns": int(mtime), **content_digest(paths[i], formats[i], int(sizes[i]))}))
    except OSError as exc:
        err = SortpackError(f"{paths[i]}: cannot read ({one_line(exc)})")
    comm.check(err)
    found = dict(pair for part in comm.allgather_obj(mine) for pair in part)
    return [found[i] for i in range(len(paths))]


def check_unchanged(entry: dict, size: int, rows: int | None) -> None:
    """Raise one line when an input file differs from its manifest entry (``rows``: None when unknown)."""
    path = entry["path"]
    if size != int(entry["bytes"]):
        raise SortpackError(f"{path}: {size} bytes, the plan was analyzed from {entry['bytes']} bytes "
                            "(the input changed since analyze)")
    mtime = os.stat(path).st_mtime_ns
    moved = entry.get("mtime_ns") is not None and mtime != int(entry["mtime_ns"])
    if moved and entry.get("sha256_of") != "file":
        raise SortpackError(f"{path}: modified since analyze (mtime {mtime} ns, the plan recorded "
                            f"{entry['mtime_ns']}); analyze it again")
    if entry.get("sha256"):
        now = content_digest(path, entry["format"], size)
        if now["sha256"] != entry["sha256"] or now["sha256_of"] != entry.get("sha256_of"):
            raise SortpackError(f"{path}: content changed since analyze (the sha256 of its "
                                f"{entry.get('sha256_of', 'content')} differs); analyze it again")
    if rows is not None and rows != int(entry["rows"]):
        raise SortpackError(f"{path}: {rows} rows, the plan was analyzed from {entry['rows']} rows "
                            "(the input changed since analyze)")


def split_mtimes(files: list[dict]) -> tuple[list[dict], list[int | None] | None]:
    """Return the entries without ``mtime_ns`` and the mtimes in order (None when no entry has one)."""
    if not any("mtime_ns" in f for f in files):
        return files, None
    return ([{k: v for k, v in f.items() if k != "mtime_ns"} for f in files],
            [f.get("mtime_ns") for f in files])


def with_mtimes(manifest: dict) -> list[dict]:
    """Return a manifest's ``source.files`` with each file's ``mtime_ns`` from the provenance (when recorded)."""
    files = list(manifest["source"]["files"])
    mtimes = (manifest.get("provenance") or {}).get("source_mtime_ns")
    if not isinstance(mtimes, list) or len(mtimes) != len(files):
        return files
    return [{**f, "mtime_ns": m} if m is not None else f for f, m in zip(files, mtimes)]
