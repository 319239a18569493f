"""JPEG sizes from headers: each image's markers walked to its first frame header (SOFn), whose height
and width are the stored size. The compiled kernel walks image by image; the numpy fallback steps
every image still walking one marker at a time (a JPEG has a handful of segments before its frame)."""
from __future__ import annotations

import numpy as np

from ._loader import _c, _i64, _ptr

# the statuses (as sortpack.inputs.media.images names them)
OK, TRUNCATED, CORRUPT, NO_SIZE = 0, 1, 3, 4
_NO_LENGTH = np.zeros(256, bool)  # markers without a length: SOI, RST0-7, TEM
_NO_LENGTH[[0xD8, *range(0xD0, 0xD8), 0x01]] = True
_BEFORE_FRAME = np.zeros(256, bool)  # EOI, SOS, a stuffed zero: the frame header can no longer come
_BEFORE_FRAME[[0xD9, 0xDA, 0x00]] = True
_FRAME = np.zeros(256, bool)  # SOF0-SOF15 but DHT (C4), JPG (C8) and DAC (CC)
_FRAME[[m for m in range(0xC0, 0xD0) if m not in (0xC4, 0xC8, 0xCC)]] = True


def jpeg_sizes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """Return (width, height, status, need) of the JPEGs at bytes ``[starts[i], ends[i])`` of ``data``.

    Each image begins with SOI (FF D8, checked by the caller). ``status`` is OK, TRUNCATED (the
    walk needs ``need`` bytes from the image's start), CORRUPT (a byte where a marker must be, or
    the scan or the end before any frame header) or NO_SIZE (a zero width, or a height a DNL
    marker sets after the first scan).
    """
    data = np.ascontiguousarray(data, dtype=np.uint8)
    starts, ends = _i64(starts), _i64(ends)
    out = [np.zeros(len(starts), np.int64) for _ in range(4)]
    lib = _c()
    if lib is None:
        return _numpy_sizes(data, starts, ends)
    if len(starts):
        lib.sp_jpeg_sizes(_ptr(data), _ptr(starts), _ptr(ends), len(starts), *map(_ptr, out))
    return tuple(out)


def _numpy_sizes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """Return what ``jpeg_sizes`` returns, walking every unfinished image one marker per step."""
    n = len(starts)
    width, height, need = (np.zeros(n, np.int64) for _ in range(3))
    status = np.full(n, -1, np.int64)
    pos = starts + 2
    live = np.arange(n)
    last = len(data) - 1

    def byte(at: np.ndarray) -> np.ndarray:
        return data[np.minimum(at, last)].astype(np.int64) if last >= 0 else np.zeros(len(at), np.int64)

    def finish(live: np.ndarray, mask: np.ndarray, code: int, want: np.ndarray | None = None) -> None:
        status[live[mask]] = code
        if want is not None:
            need[live[mask]] = want[mask] - starts[live[mask]]

    while live.size:
        p, end = pos[live], ends[live]
        short = p + 2 > end
        finish(live, short, TRUNCATED, p + 2)
        b0, m = byte(p), byte(p + 1)
        finish(live, ~short & (b0 != 0xFF), CORRUPT)
        going = ~short & (b0 == 0xFF)
        fill = going & (m == 0xFF)
        bare = going & _NO_LENGTH[m]
        finish(live, going & _BEFORE_FRAME[m], CORRUPT)
        seg_at = going & ~fill & ~bare & ~_BEFORE_FRAME[m]
        finish(live, seg_at & (p + 4 > end), TRUNCATED, p + 4)
        seg_at &= p + 4 <= end
        seg = (byte(p + 2) << 8) | byte(p + 3)
        finish(live, seg_at & (seg < 2), CORRUPT)
        seg_at &= seg >= 2
        frame = seg_at & _FRAME[m]
        finish(live, frame & (p + 9 > end), TRUNCATED, p + 9)
        frame &= p + 9 <= end
        idx = live[frame]
        height[idx] = (byte(p[frame] + 5) << 8) | byte(p[frame] + 6)
        width[idx] = (byte(p[frame] + 7) << 8) | byte(p[frame] + 8)
        status[idx] = np.where((width[idx] > 0) & (height[idx] > 0), OK, NO_SIZE)
        step = np.where(fill, 1, np.where(bare, 2, seg + 2))
        pos[live] = p + step
        live = live[status[live] < 0]
    return width, height, status, need
