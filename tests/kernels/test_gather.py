"""gather_bytes: byte ranges of many buffers copied one after another, compiled and numpy alike."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack import kernels as K
from sortpack.kernels import _loader


def _case(seed):
    rng = np.random.default_rng(seed)
    buffers = [rng.integers(0, 256, rng.integers(0, 200), dtype=np.uint8) for _ in range(rng.integers(1, 5))]
    m = int(rng.integers(0, 60))
    piece = rng.integers(0, len(buffers), m)
    start, length = np.zeros(m, np.int64), np.zeros(m, np.int64)
    for i, k in enumerate(piece):
        n = len(buffers[k])
        start[i] = rng.integers(0, n + 1)
        length[i] = rng.integers(0, n - start[i] + 1)
    expected = b"".join(buffers[k][s:s + n].tobytes() for k, s, n in zip(piece, start, length))
    return buffers, piece, start, length, expected


def _bases(buffers):
    return np.array([b.ctypes.data for b in buffers], dtype=np.uint64)


@pytest.mark.parametrize("seed", range(40))
def test_gather_matches_slicing_compiled_and_fallback(seed, monkeypatch):
    buffers, piece, start, length, expected = _case(seed)
    for hide in (False, True):
        if hide:
            monkeypatch.setattr(_loader, "_clib", None)
            monkeypatch.setattr(_loader, "_warned", True)
        dst = np.full(len(expected) + 3, 7, dtype=np.uint8)
        K.gather_bytes(_bases(buffers), buffers, piece, start, length, dst)
        assert dst[:len(expected)].tobytes() == expected
        assert (dst[len(expected):] == 7).all()  # nothing written past the rows


def test_gather_refuses_a_short_destination_and_a_bad_piece():
    buffers = [np.arange(10, dtype=np.uint8)]
    with pytest.raises(ValueError, match="more bytes"):
        K.gather_bytes(_bases(buffers), buffers, [0], [0], [10], np.empty(9, np.uint8))
    if K.backend() == "c":
        with pytest.raises(ValueError, match="out of range"):
            K.gather_bytes(_bases(buffers), buffers, [1], [0], [1], np.empty(1, np.uint8))


@pytest.mark.parametrize("bad", [-1, 2])
def test_the_fallback_refuses_a_bad_piece_as_the_kernel_does(bad, fallback):
    # the fallback indexed the buffers with it: -1 copied the last buffer's bytes (wrong data, no error)
    buffers = [np.arange(10, dtype=np.uint8), np.arange(10, 20, dtype=np.uint8)]
    dst = np.zeros(3, np.uint8)
    with pytest.raises(ValueError, match="out of range"):
        fallback.gather_bytes(_bases(buffers), buffers, [0, bad], [0, 1], [1, 2], dst)
