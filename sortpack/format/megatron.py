"""Megatron-LM's indexed dataset on disk (``PREFIX.idx`` beside ``PREFIX.bin``): the byte layout, read and written.

The layout is megatron-core's (``megatron/core/datasets/indexed_dataset.py``: ``_IndexWriter``
writes it, ``_IndexReader`` reads it), all little-endian:

=========  ==========  ====================================================================
offset     type        what
=========  ==========  ====================================================================
0          9 bytes     the magic ``MMIDIDX\\x00\\x00``
9          uint64      the version, 1
17         uint8       the dtype code of the tokens in ``.bin`` (``DTYPES``)
18         uint64      N, the sequence count
26         uint64      D, the document index count (documents + 1)
34         int32[N]    each sequence's length in tokens
34 + 4N    int64[N]    each sequence's byte offset in ``.bin`` (its pointer)
34 + 12N   int64[D]    the document indices: the sequence each document starts at, 0 first, N last
34+12N+8D  int8[N]     each sequence's mode (multimodal datasets only; nothing else follows)
=========  ==========  ====================================================================

``.bin`` holds the tokens, sequence ``i`` the ``lengths[i]`` values of the dtype at byte
``pointers[i]``. Megatron writes them one after another (``pointers`` the running sum of
``lengths * itemsize``); a reader here follows the pointers, whatever their order.

No MPI and no writer state here: the input format (``inputs.megatron``), the reader
(``reader.megatron``) and the export (``write.export``) all read and write through these functions.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from ..errors import SortpackError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document indices
HEADER_BYTES = HEADER.size  # 34

# megatron-core's DType enum: code -> numpy dtype
DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8), 2: np.dtype(np.int8), 3: np.dtype(np.int16), 4: np.dtype(np.int32),
    5: np.dtype(np.int64), 6: np.dtype(np.float64), 7: np.dtype(np.float32), 8: np.dtype(np.uint16),
}
CODES: dict[np.dtype, int] = {dtype: code for code, dtype in DTYPES.items()}


class MegatronIndex(NamedTuple):
    """A parsed ``.idx``: the tokens' dtype and the per-sequence and per-document arrays (views of its bytes)."""

    dtype: np.dtype
    lengths: np.ndarray  # int32, tokens per sequence
    pointers: np.ndarray  # int64, byte offset of each sequence in .bin
    documents: np.ndarray  # int64, D entries: 0, ..., N
    modes: np.ndarray | None  # int8 per sequence (multimodal), else None

    @property
    def num_sequences(self) -> int:
        """Return N, the number of sequences."""
        return len(self.lengths)

    def bin_bytes(self) -> int:
        """Return the bytes ``.bin`` must hold at least: the end of the sequence that ends last."""
        if not len(self.lengths):
            return 0
        return int((self.pointers + self.lengths.astype(np.int64) * self.dtype.itemsize).max())

    def contiguous(self) -> bool:
        """Return whether the sequences lie one after another from byte 0 (as Megatron writes them)."""
        ends = np.cumsum(self.lengths.astype(np.int64) * self.dtype.itemsize)
        return bool(len(ends) == 0 or (self.pointers[0] == 0 and np.array_equal(self.pointers[1:], ends[:-1])))


def index_bytes(n: int, d: int, modes: bool = False) -> int:
    """Return the size of an ``.idx`` of ``n`` sequences and ``d`` document indices (with modes or not)."""
    return HEADER_BYTES + 12 * n + 8 * d + (n if modes else 0)


def read_index(buf, where: str) -> MegatronIndex:
    """Return the ``MegatronIndex`` of an ``.idx``'s bytes (``buf``: bytes or a uint8 array), checked.

    One line names ``where`` and what is wrong: a short file, the magic, the version, an
    unknown or non-integer dtype code, a size that disagrees with the counts, a negative
    length or pointer, document indices that do not run from 0 to N.
    """
    data = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    if len(data) < HEADER_BYTES:
        raise SortpackError(f"{where}: {len(data)} bytes, shorter than a Megatron index header ({HEADER_BYTES})")
    magic, version, code, n, d = HEADER.unpack(data[:HEADER_BYTES].tobytes())
    if magic != MAGIC:
        raise SortpackError(f"{where}: not a Megatron index (starts with {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise SortpackError(f"{where}: Megatron index version {version}; sortpack reads version {VERSION}")
    dtype = DTYPES.get(code)
    if dtype is None:
        raise SortpackError(f"{where}: unknown dtype code {code} (megatron-core's codes are 1-8)")
    if dtype.kind == "f":
        raise SortpackError(f"{where}: dtype code {code} ({dtype}) holds no token ids; sortpack reads the integer "
                            "dtypes (codes 1-5, 8)")
    size = len(data)
    if n > size or d > size or size not in (index_bytes(n, d), index_bytes(n, d, modes=True)):
        raise SortpackError(f"{where}: {size} bytes, but {n} sequences and {d} document indices take "
                            f"{index_bytes(n, d)} (or {index_bytes(n, d, modes=True)} with modes): truncated or "
                            "not a Megatron index")
    at = HEADER_BYTES
    lengths = data[at:at + 4 * n].view("<i4")
    pointers = data[at + 4 * n:at + 12 * n].view("<i8")
    documents = data[at + 12 * n:at + 12 * n + 8 * d].view("<i8")
    modes = data[at + 12 * n + 8 * d:].view(np.int8) if size == index_bytes(n, d, modes=True) and n else None
    _check_arrays(where, n, lengths, pointers, documents)
    return MegatronIndex(dtype, lengths, pointers, documents, modes)


def _check_arrays(where: str, n: int, lengths: np.ndarray, pointers: np.ndarray, documents: np.ndarray) -> None:
    """Raise one line when a length or pointer is negative or the document indices do not run from 0 to N."""
    if n and int(lengths.min()) < 0:
        raise SortpackError(f"{where}: sequence {int(np.argmax(lengths < 0))} has a negative length")
    if n and int(pointers.min()) < 0:
        raise SortpackError(f"{where}: sequence {int(np.argmax(pointers < 0))} has a negative pointer")
    if not len(documents) or int(documents[0]) != 0 or int(documents[-1]) != n or \
            bool(np.any(np.diff(documents) < 0)):
        raise SortpackError(f"{where}: the document indices do not run from 0 to the sequence count {n} "
                            "(corrupt index)")


def check_bin(index: MegatronIndex, bin_size: int, where: str) -> None:
    """Raise one line when ``.bin`` (``bin_size`` bytes, named ``where``) is shorter than the pointers say."""
    need = index.bin_bytes()
    if bin_size < need:
        last = int(np.argmax(index.pointers + index.lengths.astype(np.int64) * index.dtype.itemsize))
        raise SortpackError(f"{where}: {bin_size} bytes, but sequence {last} of the index ends at byte {need} "
                            "(truncated, or not this index's data)")


def bin_path(idx_path: str) -> str:
    """Return the ``.bin`` beside an ``.idx`` (``PREFIX.idx`` -> ``PREFIX.bin``)."""
    return prefix_of(idx_path) + ".bin"


def prefix_of(path: str) -> str:
    """Return the prefix of ``PREFIX.idx`` or ``PREFIX.bin`` (a prefix given as is stays)."""
    return path[:-4] if path.endswith((".idx", ".bin")) else path


# --- writing --------------------------------------------------------------------------------


def header(dtype: np.dtype, n: int, d: int) -> bytes:
    """Return the 34 header bytes of an ``.idx`` of ``n`` sequences of ``dtype`` and ``d`` document indices."""
    return HEADER.pack(MAGIC, VERSION, CODES[np.dtype(dtype)], n, d)


class IndexLayout(NamedTuple):
    """Where each section of an ``.idx`` of ``n`` sequences and ``d`` document indices starts, and its size."""

    lengths: int
    pointers: int
    documents: int
    total: int

    @classmethod
    def of(cls, n: int, d: int) -> IndexLayout:
        """Return the layout of an ``.idx`` without modes."""
        return cls(HEADER_BYTES, HEADER_BYTES + 4 * n, HEADER_BYTES + 12 * n, index_bytes(n, d))


_UNSIGNED = (np.dtype(np.uint16), np.dtype(np.int32), np.dtype(np.int64))
_SIGNED = (np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64))


def smallest_dtype(low: int, high: int) -> np.dtype:
    """Return the smallest Megatron dtype holding every value in ``[low, high]``.

    Token ids (``low >= 0``): uint16 up to 65535, as Megatron's preprocessing stores a
    vocabulary that fits, then int32, then int64. Values below 0 (labels' -100): int16,
    int32, int64.
    """
    for dtype in _UNSIGNED if low >= 0 else _SIGNED:
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    raise SortpackError(f"token values [{low}, {high}] do not fit in 64 bits")


def index_arrays(lengths: np.ndarray, num_samples: np.ndarray, seq0: int, tok0: int,
                 itemsize: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (lengths int32, pointers int64, document indices int64) of a run of sequences of an ``.idx``.

    The run's sequences are ``lengths`` long, the first is sequence ``seq0`` and starts at token
    ``tok0`` of ``.bin`` (sequences one after another, as Megatron writes them); its documents
    hold ``num_samples`` sequences each. The document indices are those that end the run's
    documents (the index's ``[first document + 1, last document + 1]``; the leading 0 is the
    first document's start).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and int(lengths.max()) > np.iinfo(np.int32).max:
        raise SortpackError(f"a sequence of {int(lengths.max())} tokens: Megatron's lengths are int32")
    starts = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    pointers = (starts + tok0) * itemsize
    documents = seq0 + np.cumsum(np.asarray(num_samples, dtype=np.int64))
    return lengths.astype("<i4"), pointers.astype("<i8"), documents.astype("<i8")
