"""utf8_cuts: greedy byte pieces between UTF-8 characters, compiled and numpy alike."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack import kernels as K
from sortpack.kernels import _loader

CHARS = ["a", " ", "é", "ß", "中", "😀"]


def _case(seed):
    rng = np.random.default_rng(seed)
    texts = ["".join(rng.choice(CHARS, size=int(rng.integers(0, 50)))) for _ in range(int(rng.integers(1, 12)))]
    raw = [t.encode() for t in texts]
    starts = np.concatenate(([0], np.cumsum([len(r) for r in raw])))
    rows = np.sort(rng.choice(len(texts), size=int(rng.integers(1, len(texts) + 1)), replace=False))
    return texts, np.frombuffer(b"".join(raw), np.uint8), starts, rows, int(rng.integers(4, 24))


def _oracle(texts, rows, cap):
    """Return the greedy pieces, one Python step per character."""
    out = []
    for r in rows.tolist():
        begin, size = 0, 0
        for ch in texts[r]:
            n = len(ch.encode())
            if size + n > cap:
                out.append((r, begin, size))
                begin, size = begin + size, 0
            size += n
        out.append((r, begin, size))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_utf8_cuts_match_the_greedy_oracle_compiled_and_fallback(seed, monkeypatch):
    texts, data, offsets, rows, cap = _case(seed)
    want = _oracle(texts, rows, cap)
    for hide in (False, True):
        if hide:
            monkeypatch.setattr(_loader, "_clib", None)
            monkeypatch.setattr(_loader, "_warned", True)
        row, begin, size = K.utf8_cuts(data, offsets, rows, cap, True)
        assert list(zip(row.tolist(), begin.tolist(), size.tolist())) == want


def test_binary_is_cut_at_any_byte_and_a_long_character_is_refused(monkeypatch):
    data = np.frombuffer("ab😀cd".encode(), np.uint8)
    for hide in (False, True):
        if hide:
            monkeypatch.setattr(_loader, "_clib", None)
            monkeypatch.setattr(_loader, "_warned", True)
        assert K.utf8_cuts(data, [0, 8], [0], 3, False)[2].tolist() == [3, 3, 2]
        with pytest.raises(ValueError, match="row 0: a character is longer than the 3 bytes"):
            K.utf8_cuts(data, [0, 8], [0], 3, True)
        assert K.utf8_cuts(data, [0, 8], [0], 4, True)[2].tolist() == [2, 4, 2]
