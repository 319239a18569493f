"""The compiled byte-level BPE of ASCII text split by GPT-2's, Llama 3's or Qwen 2's pattern
(``inputs/fast_tokens.py``'s fast path).

tiktoken runs these patterns through a backtracking regex engine (their ``\\s+(?!\\S)`` needs
one): about half its time on source code. On ASCII text the patterns' pieces need no regex
(letters, digits, the six whitespace bytes and the rest are the only classes), so the kernel
finds them by hand and merges each piece exactly as tiktoken does: the adjacent pair
whose concatenation has the lowest rank, the leftmost of equals, until no pair is a token.
A text with any byte above 127 is left to the caller (``counts`` -1), and so is one the
caller marks; the caller's own encoder (tiktoken) is this kernel's fallback, so there is no
numpy twin here: without the compiled kernels ``table`` returns None and tiktoken runs.
"""
from __future__ import annotations

import numpy as np

from ._loader import _c, _ptr

STYLES = ("gpt2", "llama3", "qwen2")  # the patterns the kernel splits by, by their names in VERIFIED_PATTERNS


class BPETable:
    """A vocabulary's token bytes and ranks in compiled memory, freed with the object."""

    def __init__(self, handle: int, lib):
        self.handle, self._lib = handle, lib
        self._free = lib.sp_bpe_free  # held here: module globals may be gone when the last one is freed at exit

    def __del__(self):
        if getattr(self, "handle", None):
            self._free(self.handle)
            self.handle = 0


def table(ranks: dict[bytes, int]) -> BPETable | None:
    """Return the compiled table of ``ranks`` (token bytes -> rank), or None without the compiled kernels.

    Examples
    --------
    >>> t = table({b"a": 0, b"b": 1, b"ab": 2})
    >>> t is None or isinstance(t, BPETable)
    True
    """
    lib = _c()
    if lib is None or not ranks:
        return None
    keys = list(ranks)
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    offsets = np.zeros(len(keys) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.frombuffer(b"".join(keys), np.uint8) if offsets[-1] else np.zeros(1, np.uint8)
    values = np.fromiter(ranks.values(), np.int64, len(keys))
    handle = lib.sp_bpe_new(_ptr(blob), _ptr(offsets), _ptr(values), len(keys))
    return BPETable(handle, lib) if handle else None


def encode_ascii(tab: BPETable, style: str, data: np.ndarray, offsets: np.ndarray, skip: np.ndarray | None = None,
                 keep: bool = True) -> tuple[np.ndarray | None, np.ndarray] | None:
    """Return (the ids of every encoded text in order as one int32 array, or None when not ``keep``; each text's
    count, -1 for a text left out) of the texts ``data[offsets[i]:offsets[i + 1]]`` split by the pattern ``style``
    names (one of ``STYLES``); None when the vocabulary lacks a byte (not byte-level) or memory ran out.

    A text is left out when it holds a byte above 127 or ``skip[i]`` is set; its ids are the caller's to make.

    Examples
    --------
    >>> ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256}
    >>> t = table(ranks)
    >>> if t is not None:
    ...     ids, counts = encode_ascii(t, "gpt2", np.frombuffer(b"ab ab\\xff", np.uint8), np.array([0, 5, 6]))
    ...     assert ids.tolist() == [256, 32, 256] and counts.tolist() == [3, -1]
    """
    n = len(offsets) - 1
    if n <= 0:
        return (np.zeros(0, np.int32) if keep else None), np.zeros(0, np.int64)
    lib = tab._lib
    data = np.ascontiguousarray(data, dtype=np.uint8)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    counts = np.empty(n, np.int64)
    # one id per byte at most: every token holds at least one
    out = np.empty(max(int(offsets[-1] - offsets[0]), 1), np.int32) if keep else None
    mask = None if skip is None else np.ascontiguousarray(skip, dtype=np.uint8)
    got = lib.sp_bpe_encode_ascii(tab.handle, STYLES.index(style), _ptr(data) if len(data) else None, _ptr(offsets),
                                  n, None if mask is None else _ptr(mask), None if out is None else _ptr(out),
                                  _ptr(counts))
    if got < 0:
        return None
    return (out[:got] if out is not None else None), counts
