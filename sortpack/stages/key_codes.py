"""Sort keys as uint64 codes: any int64 or float64 key, either direction, in one unsigned order."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..parallel import Comm


@dataclass
class KeyCodec:
    """Maps key values to uint64 codes in the same order (starting at 0) and back, exactly."""

    offset: int
    descending: bool
    is_float: bool
    bits: int  # bits the largest code needs

    def decode(self, codes: np.ndarray, in_place: bool = False) -> np.ndarray:
        """Return the key values of ``codes`` (int64, or float64 for float keys).

        ``in_place`` reuses the codes' memory for integer keys.
        """
        if in_place:
            codes += np.uint64(self.offset)
            raw = codes
        else:
            raw = codes + np.uint64(self.offset)
        if self.descending:
            np.invert(raw, out=raw)
        if not self.is_float:
            return raw.view(np.int64)
        top = (raw >> np.uint64(63)).astype(bool)
        return np.where(top, raw ^ np.uint64(1 << 63), ~raw).view(np.float64)


def encode_keys(comm: Comm, values: np.ndarray, descending: bool) -> tuple[np.ndarray, KeyCodec]:
    """Return (fresh uint64 codes whose order is the values' order, their codec)."""
    is_float = values.dtype.kind == "f"
    if is_float:
        # IEEE order: flip every bit of negatives, only the sign bit of the rest
        bits = values.astype(np.float64, copy=False).view(np.uint64)
        codes = np.where((bits >> np.uint64(63)).astype(bool), ~bits, bits | np.uint64(1 << 63))
    else:
        codes = values.astype(np.uint64)
    if descending:
        np.invert(codes, out=codes)
    lo = comm.allreduce(np.array([codes.min() if codes.size else np.iinfo(np.uint64).max], np.uint64), "min")[0]
    codes -= lo
    hi = comm.allreduce(np.array([codes.max() if codes.size else 0], np.uint64), "max")[0]
    return codes, KeyCodec(int(lo), descending, is_float, int(hi).bit_length())
