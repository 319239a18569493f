"""The compiled BPE of SentencePiece-style tokenizer.json files (Mistral 7B, Llama 2): a whole text is one word.

Such a file has no pre-tokenizer: its normalizer or its Metaspace pre-tokenizer replaces every space by
U+2581 and puts one in front, and its BPE model (with byte fallback) merges the whole text's characters.
``tokenizers`` runs that merge per text with a heap, single-threaded per text; the kernel
(``_spbpe.c``, a second source of the ``_cbpe`` extension) runs the same algorithm (the same heap
order, the same skipping of stale entries) over the Arrow buffers of a whole column with the GIL
released, so its ids are the file's by construction (``inputs/sp_conversion.py`` decides which files
it applies to). A text the caller marks or one that is not UTF-8 is left to the caller (``counts``
-1); the caller's own encoder (``tokenizers``) is this kernel's fallback, so there is no numpy twin.
"""
from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np

from ._loader import _ptr, load_extension

_ABI = ("sp_spbpe_abi_version", 2)  # must equal SPB_ABI_VERSION in _spbpe.c
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "sp_spbpe_abi_version": ([], _I64),
    "sp_spbpe_new": ([_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _I64], _PTR),
    "sp_spbpe_widest": ([_PTR], _I64),
    "sp_spbpe_free": ([_PTR], None),
    "sp_spbpe_encode": ([_PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR], _I64),
}
STYLE = "sentencepiece"  # the style TokenEncoder.compiled names for this kernel (kernels.bpe's are its patterns)
NEVER, ALWAYS, UNLESS_THERE = 0, 1, 2  # where a text gets the replacement in front
_UNLOADED: Any = object()
_lib: Any = _UNLOADED
unavailable = ""  # why the compiled kernel is not in use ("" while it is, or before the first table)


def _library() -> Any:
    """Return the ctypes handle of ``_cbpe`` with these functions (None, with ``unavailable`` saying why)."""
    global _lib, unavailable
    if _lib is _UNLOADED:
        _lib, unavailable = load_extension(__name__.rpartition(".")[0] + "._cbpe", _SIGNATURES, _ABI)
    return _lib


class SpTable:
    """A SentencePiece-style vocabulary's characters, byte-fallback ids and merges in compiled memory."""

    def __init__(self, handle: int, lib, per_byte: int):
        self.handle, self._lib = handle, lib
        # ids a text byte (and a text's prepended replacement) can become at most: where a space's replacement is no
        # token, its UTF-8 bytes (up to four)
        self.per_byte = per_byte
        self._free = lib.sp_spbpe_free  # held here: module globals may be gone when the last one is freed at exit

    def __del__(self):
        if getattr(self, "handle", None):
            self._free(self.handle)
            self.handle = 0


class SpVocab(NamedTuple):
    """What the kernel merges with: ``chars``, each one-character token -> its id; ``byte_ids``, the ids of
    ``<0x00>``..``<0xFF>``; ``merges``, (m, 3) int32 rows (left id, right id, made id), their rank their row;
    ``replacement``, what a space becomes; ``prepend``: ``NEVER``, ``ALWAYS`` (before every non-empty text: a
    Prepend normalizer) or ``UNLESS_THERE`` (unless the text starts with it already: a Metaspace pre-tokenizer);
    ``bigrams``: ``bigrams_of`` the tokens the merges make, where no merge takes a byte-fallback token (None:
    unknown, and a text is merged whole; given, a text is merged word by word between the code points no merge
    can join, with the same ids and in far less time)."""

    chars: dict[str, int]
    byte_ids: list[int]
    merges: np.ndarray
    replacement: str = "\u2581"
    prepend: int = 1  # ALWAYS
    bigrams: np.ndarray | None = None


def table(vocab: SpVocab) -> SpTable | None:
    """Return the compiled table of ``vocab`` (None without the compiled kernel).

    Examples
    --------
    >>> t = table(SpVocab({"a": 3, "b": 4, "\u2581": 5}, list(range(256)), np.array([[3, 4, 6], [5, 6, 7]], np.int32)))
    >>> t is None or encode(t, (np.frombuffer(b"ab ab", np.uint8), np.array([0, 5])))[0].tolist() == [7, 7]
    True
    """
    lib = _library()
    if lib is None:
        return None
    chars, replacement = vocab.chars, vocab.replacement
    cps = np.fromiter((ord(c) for c in chars), np.int32, len(chars))
    ids = np.fromiter(chars.values(), np.int32, len(chars))
    byte_arr = np.ascontiguousarray(vocab.byte_ids, np.int32)
    if byte_arr.shape != (256,):
        raise ValueError("sortpack.kernels.sp_bpe: byte_ids must hold 256 ids")
    merges = np.ascontiguousarray(vocab.merges, np.int32).reshape(-1, 3)
    cols = [np.ascontiguousarray(merges[:, k]) for k in range(3)]
    keep = cps if len(cps) else np.zeros(1, np.int32), ids if len(ids) else np.zeros(1, np.int32)
    cols = [c if len(c) else np.zeros(1, np.int32) for c in cols]
    pairs = None if vocab.bigrams is None else np.ascontiguousarray(vocab.bigrams, np.uint64)
    handle = lib.sp_spbpe_new(_ptr(keep[0]), _ptr(keep[1]), len(chars), _ptr(byte_arr), _ptr(cols[0]),
                              _ptr(cols[1]), _ptr(cols[2]), len(merges), ord(replacement), int(vocab.prepend),
                              None if pairs is None else _ptr(pairs if len(pairs) else np.zeros(1, np.uint64)),
                              0 if pairs is None else len(pairs))
    return SpTable(handle, lib, int(lib.sp_spbpe_widest(handle))) if handle else None


def bigrams_of(tokens: list[str]) -> np.ndarray:
    """Return the distinct pairs of adjacent code points inside ``tokens``, each as ``first << 21 | second`` (uint64).

    Examples
    --------
    >>> [(int(k) >> 21, int(k) & 0x1FFFFF) for k in bigrams_of(["ab", "b", "abb"])] == [(97, 98), (98, 98)]
    True
    >>> [(int(k) >> 21, int(k) & 0x1FFFFF) for k in bigrams_of(["a\\0", "", "\\0b"])] == [(0, 98), (97, 0)]
    True
    """
    # the tokens end to end, and where each ends: no separator character, since a token may hold any one (U+0000 too)
    cps = np.frombuffer("".join(tokens).encode("utf-32-le"), np.uint32).astype(np.uint64)
    keys = (cps[:-1] << np.uint64(21)) | cps[1:]
    inside = np.ones(len(keys), bool)
    ends = np.cumsum(np.fromiter(map(len, tokens), np.int64, len(tokens)))
    inside[ends[(ends > 0) & (ends < len(cps))] - 1] = False  # the pair of a token's last and the next one's first
    return np.unique(keys[inside])


def encode(tab: SpTable, texts: tuple[np.ndarray, np.ndarray], skip: np.ndarray | None = None,
           keep: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """Return (the ids of every encoded text in order as one int32 array, or None when not ``keep``; each text's
    count, -1 for a text left out) of the UTF-8 texts ``data[offsets[i]:offsets[i + 1]]`` (``texts``: the bytes
    and the n + 1 offsets, as an Arrow string array holds them). A text is left out when ``skip[i]`` is set or
    when it is not UTF-8, holds a byte with no fallback id, or is 512 MiB or more. Raises ``MemoryError`` when memory
    ran out."""
    data, offsets = texts
    n = len(offsets) - 1
    if n <= 0:
        return (np.zeros(0, np.int32) if keep else None), np.zeros(0, np.int64)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    counts = np.empty(n, np.int64)
    # one id per byte at most and one prepended, each up to four where a space's replacement is no token (its bytes)
    out = np.empty(max(tab.per_byte * (int(offsets[-1] - offsets[0]) + n), 1), np.int32) if keep else None
    mask = None if skip is None else np.ascontiguousarray(skip, dtype=np.uint8)
    got = tab._lib.sp_spbpe_encode(tab.handle, _ptr(data) if len(data) else None, _ptr(offsets), n,
                                   None if mask is None else _ptr(mask), None if out is None else _ptr(out),
                                   _ptr(counts))
    if got == -1:
        raise MemoryError("sortpack.kernels.sp_bpe: out of memory while merging a text")
    return (out[:got] if out is not None else None), counts
