"""The media values of a column, per sample: bytes in the column, or paths and URLs of files.

A column holds one value per row (binary, a path string, or a Hugging Face ``Image``/``Audio``
struct of ``bytes`` and ``path``) or a list of them per row (a sample's images). A null row, an
empty list or a null element is no value. ``Values`` keeps, per value, its row and either its
bytes (a range of the Arrow data buffer, never copied) or its path. A relative path is relative
to ``root`` (the SPEC's ``root=``), else to the directory of the input file that holds the row;
``s3://`` and ``gs://`` URLs are read through ``inputs.objects``.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ...arrow_types import is_binary, is_list, is_text
from .. import objects

READ_THREADS = 16  # files read at once (a network filesystem or an object store answers in parallel)


class MediaError(ValueError):
    """A value whose header cannot give its size: ``row`` (of the table measured) and what is wrong."""

    def __init__(self, row: int, detail: str):
        super().__init__(f"row {row}: {detail}")
        self.row = row
        self.detail = detail


@dataclass
class Values:
    """The values of one column chunk: per value its row, and its bytes ``[starts, ends)`` of ``data`` or its path."""

    rows: np.ndarray  # int64, ascending: the row of each value
    data: np.ndarray  # uint8: the buffer the in-column values are ranges of
    starts: np.ndarray  # int64 per value (in-column values)
    ends: np.ndarray
    paths: list[str | None]  # per value: its file's path, None for bytes in the column (empty: all in the column)
    listed: bool  # the column holds lists (a message names the value's place in its row)

    def where(self, i: int) -> str:
        """Return how a message names value ``i`` (beside its row)."""
        place = f"value {i - int(np.searchsorted(self.rows, self.rows[i]))} of the row" if self.listed else ""
        path = self.paths[i] if self.paths else None
        return ", ".join(p for p in (place, path and f"file {path}") if p)


def takes(t: pa.DataType) -> bool:
    """Return whether a column of type ``t`` holds media values (or lists of them)."""
    if is_list(t) and hasattr(t, "value_type"):
        t = t.value_type
    return is_binary(t) or is_text(t) or _is_media_struct(t)


def _is_media_struct(t: pa.DataType) -> bool:
    """Return whether ``t`` is a struct of ``bytes`` and/or ``path`` (Hugging Face's Image and Audio features)."""
    return pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} & {"bytes", "path"} != set()


def column_values(chunk: pa.Array) -> Values:
    """Return the ``Values`` of one chunk of a media column (``takes`` its type)."""
    valid = _valid(chunk)
    if is_list(chunk.type):
        offsets = chunk.offsets.to_numpy().astype(np.int64)
        counts = np.where(valid, np.diff(offsets), 0)
        rows = np.repeat(np.arange(len(chunk), dtype=np.int64), counts)
        first = np.repeat(offsets[:-1], counts)
        index = first + np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
        return _values(chunk.values, index, rows, True)
    index = np.flatnonzero(valid).astype(np.int64)
    return _values(chunk, index, index, False)


def _valid(arr: pa.Array) -> np.ndarray:
    """Return which entries of ``arr`` are not null."""
    if arr.null_count == 0:
        return np.ones(len(arr), bool)
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _values(arr: pa.Array, index: np.ndarray, rows: np.ndarray, listed: bool) -> Values:
    """Return the ``Values`` of entries ``index`` of ``arr`` (rows ``rows``), its null entries left out."""
    t = arr.type
    if _is_media_struct(t):
        names = {t.field(i).name for i in range(t.num_fields) if not pa.types.is_null(t.field(i).type)}
        data = arr.field("bytes") if "bytes" in names else pa.nulls(len(arr), pa.binary())
        path = arr.field("path") if "path" in names else pa.nulls(len(arr), pa.string())
        keep = _valid(arr)[index] & (_valid(data)[index] | _valid(path)[index])
        index, rows = index[keep], rows[keep]
        in_column = _valid(data)[index]
        out = _bytes_of(data, index, rows, listed)
        paths = path.take(pa.array(index[~in_column])).to_pylist() if (~in_column).any() else []
        out.starts[~in_column] = 0
        out.ends[~in_column] = 0
        if paths:  # else every value is in the column: no paths
            it = iter(paths)
            out.paths = [None if b else next(it) for b in in_column]
        return out
    keep = _valid(arr)[index]
    index, rows = index[keep], rows[keep]
    if is_text(t):
        out = Values(rows, np.zeros(0, np.uint8), np.zeros(len(index), np.int64), np.zeros(len(index), np.int64),
                     [], listed)
        out.paths = arr.take(pa.array(index)).to_pylist() if len(index) else []
        return out
    return _bytes_of(arr, index, rows, listed)


def _bytes_of(arr: pa.Array, index: np.ndarray, rows: np.ndarray, listed: bool) -> Values:
    """Return the ``Values`` whose bytes are entries ``index`` of the binary array ``arr`` (no copy)."""
    bufs = arr.buffers()
    data = np.frombuffer(bufs[-1], np.uint8) if bufs[-1] is not None else np.zeros(0, np.uint8)
    if pa.types.is_fixed_size_binary(arr.type):
        width = arr.type.byte_width
        starts = (arr.offset + index) * width
        return Values(rows, data, starts, starts + width, [], listed)
    dtype = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(bufs[1], dtype)[arr.offset:arr.offset + len(arr) + 1].astype(np.int64) \
        if bufs[1] is not None else np.zeros(len(arr) + 1, np.int64)
    return Values(rows, data, offsets[index], offsets[index + 1], [], listed)


def resolve(path: str, root: str | None, source: str) -> str:
    """Return the file a value's ``path`` names: a URL or an absolute path as is, else under ``root`` or the
    directory of the input file ``source``."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    if objects.url_scheme(path) is not None or os.path.isabs(path):
        return path
    base = root if root is not None else _directory(source)
    if objects.is_url(base):
        return base.rstrip("/") + "/" + path
    return os.path.join(base, path)


def _directory(source: str) -> str:
    """Return the directory of an input file (a URL's prefix up to its last ``/``)."""
    if objects.is_url(source):
        return str(source).rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(source))


def read_at(path: str, offset: int, n: int) -> bytes:
    """Return up to ``n`` bytes of the file or object ``path`` from ``offset``."""
    if "://" not in path:  # a local file: no URL to parse (this is per image)
        with open(path, "rb", buffering=0) as fh:
            if offset:
                fh.seek(offset)
            return fh.read(n)
    objects.check_scheme(path)
    if objects.is_url(path):
        with objects.open_input(path) as fh:
            size = fh.size()
            return fh.read_at(max(0, min(n, size - offset)), offset) if offset < size else b""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(n)


def size_of(path: str) -> int:
    """Return the byte size of the file or object ``path``."""
    objects.check_scheme(path)
    return objects.size_of(path)


def read_heads(paths: list[str], n: int | list[int]) -> list[bytes | BaseException]:
    """Return the first ``n`` bytes (one count, or one per path) of each file, or the error reading it raised."""
    counts = [n] * len(paths) if isinstance(n, int) else n

    def one(k: int) -> bytes | BaseException:
        try:
            return read_at(paths[k], 0, counts[k])
        except Exception as exc:  # noqa: BLE001 - the caller names the row and the file with it
            return exc

    return in_threads(one, len(paths))


def in_threads(one, n: int) -> list:
    """Return ``[one(k) for k in range(n)]``, computed by up to READ_THREADS threads over contiguous runs of ``k``
    (a network filesystem or an object store answers many requests at once; a run per thread, not a task per
    value, keeps the pool's own cost off the per-value path)."""
    threads = min(READ_THREADS, n // 64)
    if threads < 2:
        return [one(k) for k in range(n)]
    bounds = np.linspace(0, n, threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        runs = pool.map(lambda t: [one(k) for k in range(bounds[t], bounds[t + 1])], range(threads))
        return [x for run in runs for x in run]
