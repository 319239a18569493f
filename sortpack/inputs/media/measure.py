"""The measures of the media size kinds: a column of images or audio to an int64 count per row.

Images: every value's (width, height) from its header (``images.image_sizes`` over the column's
own data buffer; a file's first bytes, more only where a JPEG's frame header lies further),
then the scheme's tokens or patches per image, summed per row. Audio: every value's
(samples, rate) from its header (``audio.audio_length``), as frames per row. A value whose
header gives no size raises ``MediaError`` naming its row (of the measured table), its place
in the row and its file.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .audio import audio_length
from .images import OK, TRUNCATED, ImageSizes, image_sizes
from .settings import AudioSettings, ImageSettings
from .values import MediaError, Values, column_values, in_threads, read_at, read_heads, resolve, size_of, takes

FIRST_READ = 4096  # the bytes of a file read first: every fixed-offset header, and most JPEGs' frame header
MORE_READ = 1 << 16  # a JPEG whose frame header lies further (EXIF thumbnails, ICC profiles) is read again
READ_ROUNDS = 8


def _per_row(values: Values, counts: np.ndarray, rows: int) -> np.ndarray:
    """Return ``counts`` (one per value) summed per row."""
    if not len(counts):
        return np.zeros(rows, np.int64)
    return np.bincount(values.rows, weights=counts.astype(np.float64), minlength=rows).astype(np.int64)


def _chunks(col: pa.ChunkedArray):
    """Yield (first row, chunk) of a column."""
    base = 0
    for chunk in col.chunks:
        yield base, chunk
        base += len(chunk)


def measure_images(col: pa.ChunkedArray, settings: ImageSettings, source: str) -> np.ndarray | None:
    """Return each row's image count, tokens or patches (None: the column holds no images)."""
    if not takes(col.type):
        return None
    parts = [np.zeros(0, np.int64)]
    for base, chunk in _chunks(col):
        values = column_values(chunk)
        if settings.what == "count":
            parts.append(_per_row(values, np.ones(len(values.rows), np.int64), len(chunk)))
            continue
        width, height = _dimensions(values, settings, source, base)
        scheme = settings.scheme
        assert scheme is not None  # a tokens or patches SPEC names its scheme
        refused = np.flatnonzero(scheme.refused(width, height))
        if refused.size:
            i = int(refused[0])
            raise MediaError(base + int(values.rows[i]), _named(values, i, f"an aspect ratio over 200 "
                             f"({int(width[i])}x{int(height[i])}), which the processor refuses"))
        count = scheme.tokens(width, height) if settings.what == "tokens" else scheme.patches(width, height)
        parts.append(_per_row(values, count, len(chunk)))
    return np.concatenate(parts)


def _named(values: Values, i: int, detail: str) -> str:
    """Return ``detail`` prefixed by value ``i``'s place in its row and its file."""
    where = values.where(i)
    return f"{where}: {detail}" if where else detail


def _dimensions(values: Values, settings: ImageSettings, source: str, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (width, height) of every value, raising ``MediaError`` at the first without a size."""
    sizes = image_sizes(values.data, values.starts, values.ends)
    width, height, status = sizes.width.copy(), sizes.height.copy(), sizes.status.copy()
    files = np.flatnonzero([p is not None for p in values.paths]) if values.paths else np.zeros(0, np.int64)
    problems: dict[int, str] = {}
    if files.size:
        paths = [resolve(str(values.paths[int(i)]), settings.root, source) for i in files]
        values.paths = list(values.paths)
        for k, at in enumerate(files):
            values.paths[int(at)] = paths[k]
        got, failed = _file_sizes(paths)
        width[files], height[files], status[files] = got.width, got.height, got.status
        problems = {int(files[k]): failed.get(int(k)) or got.problem(int(k)) for k in np.flatnonzero(got.status != OK)}
    bad = np.flatnonzero(status != OK)
    if bad.size:
        i = int(bad[0])
        detail = problems.get(i) or sizes.problem(i)
        raise MediaError(base + int(values.rows[i]), _named(values, i, detail))
    return width, height


def _file_sizes(paths: list[str]) -> tuple[ImageSizes, dict[int, str]]:
    """Return the ``ImageSizes`` of image files, reading their first bytes (more where a JPEG needs it), and
    why each file that could not be read could not."""
    asked = [FIRST_READ] * len(paths)
    heads = read_heads(paths, asked)
    for _ in range(READ_ROUNDS):
        sizes = _sizes_of(heads)
        again = [int(k) for k in np.flatnonzero(sizes.status == TRUNCATED)
                 if isinstance(head := heads[k], bytes) and len(head) == asked[k]]
        if not again:
            break
        for k in again:
            asked[k] = max(int(sizes.need[k]) * 2, asked[k] * 4, MORE_READ)
        for k, head in zip(again, read_heads([paths[k] for k in again], [asked[k] for k in again])):
            heads[k] = head
    sizes = _sizes_of(heads)
    failed = {k: f"cannot read it ({type(h).__name__}: {str(h).splitlines()[0] if str(h) else ''})"
              for k, h in enumerate(heads) if isinstance(h, BaseException)}
    sizes.status[list(failed)] = TRUNCATED
    return sizes, failed


def _sizes_of(heads: list) -> ImageSizes:
    """Return the ``ImageSizes`` of the first bytes of files (an unread file as empty)."""
    blobs = [h if isinstance(h, bytes) else b"" for h in heads]
    lengths = np.array([len(b) for b in blobs], np.int64)
    ends = np.cumsum(lengths)
    return image_sizes(np.frombuffer(b"".join(blobs), np.uint8), ends - lengths, ends)


def measure_audio(col: pa.ChunkedArray, settings: AudioSettings, source: str) -> np.ndarray | None:
    """Return each row's audio frames at ``settings.fps``, rounded up (None: the column holds no audio)."""
    if not takes(col.type):
        return None
    parts = [np.zeros(0, np.int64)]
    for base, chunk in _chunks(col):
        values = column_values(chunk)
        samples, rate = _lengths(values, settings, source, base)
        num, den = settings.fps.numerator, settings.fps.denominator
        frames = (samples * num + rate * den - 1) // (rate * den)
        parts.append(_per_row(values, frames, len(chunk)))
    return np.concatenate(parts)


def _lengths(values: Values, settings: AudioSettings, source: str, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (samples, rate) of every audio value, raising ``MediaError`` at the first without a length."""
    def one(i: int) -> tuple[int, int] | str:
        try:
            path = values.paths[i] if values.paths else None
            if path is None:
                s, e = int(values.starts[i]), int(values.ends[i])
                data = values.data
                return audio_length(lambda o, n: data[s + o:min(e, s + o + n)].tobytes(), e - s)
            path = resolve(path, settings.root, source)
            values.paths[i] = path
            return audio_length(lambda o, n: read_at(path, o, n), size_of(path))
        except (ValueError, OSError) as exc:
            return str(exc) if isinstance(exc, ValueError) else f"cannot read it ({type(exc).__name__}: {exc})"

    n = len(values.rows)
    got = in_threads(one, n) if any(p is not None for p in values.paths) else [one(i) for i in range(n)]
    for i, g in enumerate(got):
        if isinstance(g, str):
            raise MediaError(base + int(values.rows[i]), _named(values, i, g))
    pairs = np.array([g for g in got], np.int64).reshape(n, 2)
    return pairs[:, 0], pairs[:, 1]
