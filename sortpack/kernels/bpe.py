"""The compiled byte-level BPE of texts split by GPT-2's, Llama 3's or Qwen 2's pattern
(``inputs/fast_tokens.py``'s fast path).

tiktoken runs these patterns through a backtracking regex engine (their ``\\s+(?!\\S)`` needs
one): about half its time on source code. The patterns' pieces need no regex: each code point is a
letter, a number, whitespace or the rest (``unicode_classes``: the classes of the regex engines,
Unicode 16.0), so the kernel (``_bpe.c``, its own extension ``_cbpe``) finds them by hand over UTF-8
and merges each piece exactly as tiktoken does: the adjacent pair whose concatenation has the lowest
rank, the leftmost of equals, until no pair is a token; a long piece through a heap over its pairs
(O(n log n), where a rescan after each merge would be quadratic). A text the caller marks, one that
is not UTF-8, and (for a table made without the classes) one with a byte above 127 are left to the
caller (``counts`` -1); the caller's own encoder (tiktoken) is this kernel's fallback, so there is no
numpy twin here: without the compiled kernel ``table`` returns None and tiktoken runs.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ._loader import _ptr, load_extension

STYLES = ("gpt2", "llama3", "qwen2")  # the patterns the kernel splits by, by their names in VERIFIED_PATTERNS
_ABI = ("sp_bpe_abi_version", 1)  # must equal SP_BPE_ABI_VERSION in _bpe.c
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "sp_bpe_abi_version": ([], _I64),
    "sp_bpe_new": ([_PTR, _PTR, _PTR, _I64, _PTR], _PTR),
    "sp_bpe_free": ([_PTR], None),
    "sp_bpe_heap_min": ([_PTR, _I64], None),
    "sp_bpe_encode": ([_PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR], _I64),
}
_UNLOADED: Any = object()
_lib: Any = _UNLOADED
unavailable = ""  # why the compiled kernel is not in use ("" while it is, or before the first table)


def _library() -> Any:
    """Return the ctypes handle of ``_cbpe`` (None, with ``unavailable`` saying why, when it cannot load)."""
    global _lib, unavailable
    if _lib is _UNLOADED:
        _lib, unavailable = load_extension(__name__.rpartition(".")[0] + "._cbpe", _SIGNATURES, _ABI)
    return _lib


class BPETable:
    """A vocabulary's token bytes and ranks in compiled memory, freed with the object.

    ``unicode``: whether texts beyond ASCII are split too (the table holds the code point classes).
    """

    def __init__(self, handle: int, lib, unicode: bool):
        self.handle, self._lib, self.unicode = handle, lib, unicode
        self._free = lib.sp_bpe_free  # held here: module globals may be gone when the last one is freed at exit

    def __del__(self):
        if getattr(self, "handle", None):
            self._free(self.handle)
            self.handle = 0

    def heap_from(self, length: int) -> None:
        """Merge pieces of ``length`` bytes or more through the heap (64 by default; tests set 2: every piece)."""
        self._lib.sp_bpe_heap_min(self.handle, int(length))


def table(ranks: dict[bytes, int], unicode: bool = True) -> BPETable | None:
    """Return the compiled table of ``ranks`` (token bytes -> rank in [0, 2^31)), or None without the compiled kernel
    (or with a rank out of that range, or a token twice).

    ``unicode=False``: texts with a byte above 127 are left to the caller (the classes are not loaded).

    Examples
    --------
    >>> t = table({b"a": 0, b"b": 1, b"ab": 2})
    >>> t is None or isinstance(t, BPETable)
    True
    """
    lib = _library()
    if lib is None or not ranks:
        return None
    keys = list(ranks)
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    offsets = np.zeros(len(keys) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.frombuffer(b"".join(keys), np.uint8) if offsets[-1] else np.zeros(1, np.uint8)
    values = np.fromiter(ranks.values(), np.int64, len(keys))
    classes = None
    if unicode:
        from .unicode_classes import class_table

        classes = class_table()
    handle = lib.sp_bpe_new(_ptr(blob), _ptr(offsets), _ptr(values), len(keys),
                            None if classes is None else _ptr(classes))
    return BPETable(handle, lib, classes is not None) if handle else None


def encode(tab: BPETable, style: str, texts: tuple[np.ndarray, np.ndarray], skip: np.ndarray | None = None,
           keep: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """Return (the ids of every encoded text in order as one int32 array, or None when not ``keep``; each text's
    count, -1 for a text left out) of the UTF-8 texts ``data[offsets[i]:offsets[i + 1]]`` (``texts``: the bytes
    and the n + 1 offsets, as an Arrow string array holds them) split by the pattern ``style`` names (one of
    ``STYLES``).

    A text is left out when ``skip[i]`` is set, when it is not UTF-8, or when it holds a byte above 127 and the
    table was made without the classes; its ids are the caller's to make. Raises ``MemoryError`` when memory ran
    out and ``ValueError`` when a byte is no token (the ranks are not a byte-level vocabulary) or a piece is 2 GiB.

    Examples
    --------
    >>> ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, "é".encode(): 257}
    >>> t = table(ranks)
    >>> if t is not None:
    ...     ids, counts = encode(t, "gpt2", (np.frombuffer("ab éab\\xff".encode(), np.uint8), np.array([0, 7, 9])))
    ...     assert ids.tolist() == [256, 32, 257, 256, 195, 191] and counts.tolist() == [4, 2]
    """
    data, offsets = texts
    n = len(offsets) - 1
    if n <= 0:
        return (np.zeros(0, np.int32) if keep else None), np.zeros(0, np.int64)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    counts = np.empty(n, np.int64)
    # one id per byte at most: every token holds at least one
    out = np.empty(max(int(offsets[-1] - offsets[0]), 1), np.int32) if keep else None
    mask = None if skip is None else np.ascontiguousarray(skip, dtype=np.uint8)
    got = tab._lib.sp_bpe_encode(tab.handle, STYLES.index(style), _ptr(data) if len(data) else None, _ptr(offsets),
                                 n, None if mask is None else _ptr(mask), None if out is None else _ptr(out),
                                 _ptr(counts))
    if got == -1:
        raise MemoryError("sortpack.kernels.bpe: out of memory while merging a piece")
    if got == -4:
        raise ValueError("sortpack.kernels.bpe: a pre-tokenizer piece of 2 GiB or more")
    if got < 0:
        raise ValueError("sortpack.kernels.bpe: a byte is no token (not a byte-level vocabulary)")
    return (out[:got] if out is not None else None), counts
