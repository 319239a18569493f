"""Image sizes from their headers, without decoding a pixel: PNG, JPEG, WebP (VP8, VP8L, VP8X) and GIF.

The images are byte ranges of one buffer (an Arrow binary column's data and offsets). PNG, GIF
and WebP keep their size at fixed offsets: the first 32 bytes of every image are gathered
into one matrix and read with numpy at once. A JPEG's size is in its first frame header
(SOFn), after a variable run of segments: ``kernels.media.jpeg_sizes`` walks the markers.

The size is the stored one, as ``PIL.Image.open(f).size`` reports it: a JPEG's EXIF orientation
is not applied (a loader that calls ``ImageOps.exif_transpose`` swaps width and height of
orientations 5-8; the Qwen2-VL and plain patch counts do not change, see docs/multimodal.md), a
GIF's is its logical screen, an animated WebP's its canvas.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...kernels.media import jpeg_sizes

# statuses (kernels.media uses the same numbers)
OK, TRUNCATED, UNKNOWN, CORRUPT, NO_SIZE = 0, 1, 2, 3, 4
FORMATS = ("unknown", "PNG", "JPEG", "GIF", "WebP")
PNG, JPEG, GIF, WEBP = 1, 2, 3, 4
HEAD = 32  # the bytes of an image the fixed-offset formats read
_PNG_SIG = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class ImageSizes:
    """Per image: width, height, status (OK...NO_SIZE), format (index into FORMATS), the bytes a header needs."""

    width: np.ndarray
    height: np.ndarray
    status: np.ndarray
    fmt: np.ndarray
    need: np.ndarray  # TRUNCATED: the bytes from the image's start that hold its size
    length: np.ndarray  # the bytes each image had

    def problem(self, i: int) -> str:
        """Return what is wrong with image ``i``'s header, as a message says it."""
        fmt, status, length = FORMATS[int(self.fmt[i])], int(self.status[i]), int(self.length[i])
        if status == TRUNCATED:
            return f"truncated {fmt} header ({length} bytes; its size is within the first {int(self.need[i])})"
        if status == UNKNOWN:
            return "an empty value, not an image" if length == 0 else "not a PNG, JPEG, WebP or GIF image"
        if status == CORRUPT:
            what = {JPEG: " (a broken marker, or no frame header before the scan)",
                    PNG: " (no IHDR chunk first)", WEBP: " (no VP8, VP8L or VP8X frame header first)"}
            return f"corrupt {fmt} header{what.get(int(self.fmt[i]), '')}"
        return f"{fmt} header gives no size (width {int(self.width[i])}, height {int(self.height[i])})"


def _head(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (the first HEAD bytes of every image, zero past its end; which of them exist)."""
    at = starts[:, None] + np.arange(HEAD, dtype=np.int64)
    there = at < ends[:, None]
    if not len(data):
        return np.zeros(at.shape, np.uint8), there
    return np.where(there, data[np.minimum(at, len(data) - 1)], 0).astype(np.uint8), there


def _starts_with(head: np.ndarray, there: np.ndarray, sig: bytes, at: int = 0) -> np.ndarray:
    """Return which images' bytes agree with ``sig`` at offset ``at`` as far as they go."""
    want = np.frombuffer(sig, np.uint8)
    cols = slice(at, at + len(sig))
    return ((head[:, cols] == want) | ~there[:, cols]).all(axis=1)


def _be(head: np.ndarray, at: int, n: int) -> np.ndarray:
    """Return the big-endian unsigned integers of ``n`` bytes at ``at``."""
    out = np.zeros(len(head), np.int64)
    for k in range(n):
        out = (out << 8) | head[:, at + k]
    return out


def _le(head: np.ndarray, at: int, n: int) -> np.ndarray:
    """Return the little-endian unsigned integers of ``n`` bytes at ``at``."""
    return _be(head[:, at:at + n][:, ::-1], 0, n)


def image_sizes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> ImageSizes:
    """Return the ``ImageSizes`` of the images at bytes ``[starts[i], ends[i])`` of ``data`` (uint8)."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    n = len(starts)
    length = ends - starts
    head, there = _head(data, starts, ends)
    width, height, need = (np.zeros(n, np.int64) for _ in range(3))
    status = np.full(n, UNKNOWN, np.int64)
    fmt = np.zeros(n, np.int64)
    some = length > 0
    png = some & _starts_with(head, there, _PNG_SIG)
    gif = some & (_starts_with(head, there, b"GIF87a") | _starts_with(head, there, b"GIF89a"))
    webp = some & _starts_with(head, there, b"RIFF") & _starts_with(head, there, b"WEBP", 8)
    jpeg = some & _starts_with(head, there, b"\xff\xd8\xff")
    fmt[png], fmt[gif], fmt[webp], fmt[jpeg] = PNG, GIF, WEBP, JPEG

    def take(mask: np.ndarray, w: np.ndarray, h: np.ndarray, needed: int | np.ndarray) -> None:
        need[mask] = needed[mask] if isinstance(needed, np.ndarray) else needed
        short = mask & (length < need)
        full = mask & ~short
        status[short] = TRUNCATED
        width[full], height[full] = w[full], h[full]
        status[full] = np.where((w[full] > 0) & (h[full] > 0), OK, NO_SIZE)

    take(png, _be(head, 16, 4), _be(head, 20, 4), 24)
    take(gif, _le(head, 6, 2), _le(head, 8, 2), 10)
    _webp(head, webp, take)
    # a PNG whose first chunk is not IHDR, a WebP whose first chunk is no frame header: corrupt
    status[png & (length >= 24) & ~_starts_with(head, there, b"IHDR", 12)] = CORRUPT
    status[webp & (length >= 16) & ~(_starts_with(head, there, b"VP8", 12) & np.isin(head[:, 15], list(b" LX")))] \
        = CORRUPT
    status[webp & (head[:, 15] == ord(" ")) & (length >= 26) & ~_starts_with(head, there, b"\x9d\x01\x2a", 23)] \
        = CORRUPT
    status[webp & (head[:, 15] == ord("L")) & (length >= 21) & (head[:, 20] != 0x2F)] = CORRUPT
    if jpeg.any():
        idx = np.flatnonzero(jpeg)
        width[idx], height[idx], status[idx], need[idx] = jpeg_sizes(data, starts[idx], ends[idx])
    return ImageSizes(width, height, status, fmt, need, length)


def _webp(head: np.ndarray, webp: np.ndarray, take) -> None:
    """Read the WebP sizes: lossy (VP8: 14 bits each), lossless (VP8L: 14 bits minus one), extended (VP8X)."""
    chunk = head[:, 15]
    lossy = webp & (chunk == ord(" "))
    take(lossy, _le(head, 26, 2) & 0x3FFF, _le(head, 28, 2) & 0x3FFF, 30)
    bits = _le(head, 21, 4)
    take(webp & (chunk == ord("L")), (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, 25)
    take(webp & (chunk == ord("X")), _le(head, 24, 3) + 1, _le(head, 27, 3) + 1, 30)
    short = webp & ~np.isin(chunk, list(b" LX"))
    take(short, np.zeros(len(head), np.int64), np.zeros(len(head), np.int64), 16)
