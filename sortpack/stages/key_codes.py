"""Sort keys as uint64 codes: any int64 or float64 key, either direction, in one unsigned order."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..parallel import Comm


class KeyCodec(NamedTuple):
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


def encode_keys(comm: Comm, values: np.ndarray, descending: bool, out: np.ndarray | None = None
                ) -> tuple[np.ndarray, KeyCodec]:
    """Return (uint64 codes whose order is the values' order, their codec).

    The codes are fresh, or the first ``len(values)`` of ``out`` (uint64, C-contiguous, at least
    that long): a buffer the caller sized for what follows (the sort receives into it).
    """
    n = len(values)
    if out is None:
        codes = np.empty(n, np.uint64)
    elif out.dtype != np.uint64 or out.ndim != 1 or len(out) < n or not out.flags.c_contiguous:
        raise ValueError("encode_keys: out must be C-contiguous uint64 of at least len(values)")
    else:
        codes = out[:n]
    is_float = values.dtype.kind == "f"
    if is_float:
        # IEEE order: flip every bit of negatives, only the sign bit of the rest
        floats = values.astype(np.float64, copy=False)
        bits = floats.view(np.uint64)
        np.bitwise_or(bits, np.uint64(1 << 63), out=codes)
        np.invert(bits, out=codes, where=np.signbit(floats))
        if descending:
            np.invert(codes, out=codes)
        low, high = (int(codes.min()), int(codes.max())) if n else (_U64_MAX, 0)
    else:
        low, high = _U64_MAX, 0
        # a block at a time: the copy (as values.astype(np.uint64)), the flip and the extremes in one sweep
        for a in range(0, n, _ID_BLOCK):
            block = codes[a:a + _ID_BLOCK]
            np.copyto(block, values[a:a + _ID_BLOCK], casting="unsafe")
            if descending:
                np.invert(block, out=block)
            low, high = min(low, int(block.min())), max(high, int(block.max()))
    # one reduction for both extremes: the least code and the complement of the largest
    lo, top = (int(v) for v in comm.allreduce(np.array([low, _U64_MAX - high], np.uint64), "min"))
    codes -= np.uint64(lo)
    span = max(_U64_MAX - top - lo, 0)  # the largest code less the least (0 when no rank has one)
    return codes, KeyCodec(lo, descending, is_float, span.bit_length())



FIELDS = ("id", "key", "stage", "group")  # from the low bits up
_ID_BLOCK = 1 << 19  # codes made and ids packed per block (4 MiB, in cache)
_U64_MAX = (1 << 64) - 1


class KeyLayout(NamedTuple):
    """The one 64-bit sort key ``[group | stage | key | id]``, top bits first; a field of width 0 is absent.

    One ``np.sort`` of these codes orders samples by (group, stage, key, id): a mixture's
    sources, curriculum stages, the key's code (``encode_keys``) and the sample id as the
    tie-break. Without ``id_bits`` the ids travel beside the codes (they did not fit).
    """

    key_bits: int
    stage_bits: int = 0
    group_bits: int = 0
    id_bits: int = 0

    @property
    def bits(self) -> int:
        """Return the bits every field together needs."""
        return self.id_bits + self.key_bits + self.stage_bits + self.group_bits

    def fits(self) -> bool:
        """Return whether the fields fit in one uint64."""
        return self.bits <= 64

    def with_ids(self, id_bits: int) -> KeyLayout:
        """Return this layout with ``id_bits`` of sample id below the key."""
        return KeyLayout(self.key_bits, self.stage_bits, self.group_bits, id_bits)

    def width(self, field: str) -> int:
        """Return the bits of ``field`` (``id``, ``key``, ``stage`` or ``group``)."""
        return {"id": self.id_bits, "key": self.key_bits, "stage": self.stage_bits, "group": self.group_bits}[field]

    def shift(self, field: str) -> int:
        """Return the bit where ``field`` starts."""
        return sum(self.width(f) for f in FIELDS[:FIELDS.index(field)])

    def mask(self, field: str) -> np.uint64:
        """Return the mask of ``field``'s values (before the shift)."""
        return np.uint64((1 << self.width(field)) - 1)

    def pack(self, key: np.ndarray, *, stage: np.ndarray | None = None, group: np.ndarray | None = None,
             ids: np.ndarray | None = None, first_id: int | None = None) -> np.ndarray:
        """Return uint64 codes holding each given field in its place (an absent one is 0).

        ``key`` holds key codes below ``2**key_bits``; ``ids`` are int64 sample ids, or
        ``first_id`` says they are ``first_id + arange(n)``. ``key`` is left as it is
        (``pack_into`` packs in its memory).
        """
        return self.pack_into(np.asarray(key).astype(np.uint64), stage=stage, group=group, ids=ids,
                              first_id=first_id)

    def pack_into(self, codes: np.ndarray, *, stage: np.ndarray | None = None, group: np.ndarray | None = None,
                  ids: np.ndarray | None = None, first_id: int | None = None) -> np.ndarray:
        """Return ``codes`` (uint64 key codes) with the fields of ``pack`` packed in, in their own memory.

        Packing in place bounds memory on large ranks: no second array of codes.
        """
        shift = np.uint64(self.id_bits)
        if first_id is not None:
            # a block at a time: the shift and the ids in one sweep, a few MB of arange at a time
            for a in range(0, len(codes), _ID_BLOCK):
                block = codes[a:a + _ID_BLOCK]
                if self.id_bits:
                    block <<= shift
                block |= np.arange(first_id + a, first_id + a + len(block), dtype=np.uint64)
        elif self.id_bits:
            codes <<= shift
        if stage is not None:
            codes |= stage.astype(np.uint64) << np.uint64(self.shift("stage"))
        if group is not None:
            _or_groups(codes, group, self.shift("group"))
        if first_id is None and ids is not None:
            codes |= ids.astype(np.int64, copy=False).view(np.uint64)
        return codes

    def field(self, codes: np.ndarray, field: str, in_place: bool = False) -> np.ndarray:
        """Return ``field``'s values in ``codes`` as uint64 (``in_place``: in the codes' own memory)."""
        shift, mask = np.uint64(self.shift(field)), self.mask(field)
        if not in_place:
            return ((codes >> shift) if shift else codes) & mask
        if shift:
            codes >>= shift
        codes &= mask
        return codes

    def unpack(self, codes: np.ndarray) -> dict[str, np.ndarray]:
        """Return every field of the layout (``id`` int64, the rest uint64) from ``codes``."""
        out = {f: self.field(codes, f) for f in FIELDS if self.width(f)}
        if "id" in out:
            out["id"] = out["id"].view(np.int64)
        return out

    def strip_ids(self, codes: np.ndarray, into: np.ndarray | None = None) -> tuple[np.ndarray, KeyLayout]:
        """Return (the ids, the layout without them), shifting the ids out of ``codes`` in place.

        ``into`` (uint64, C-contiguous, not overlapping ``codes``): memory the caller is done with
        that the ids are written to when it is long enough (else they are a new array).
        """
        n = len(codes)
        fits = into is not None and into.dtype == np.uint64 and len(into) >= n and into.flags.c_contiguous
        ids = into[:n] if fits and into is not None else np.empty(n, np.uint64)
        mask, shift = self.mask("id"), np.uint64(self.id_bits)
        # a block at a time: the ids out and the shift in one sweep over the codes
        for a in range(0, n, _ID_BLOCK):
            block = codes[a:a + _ID_BLOCK]
            np.bitwise_and(block, mask, out=ids[a:a + _ID_BLOCK])
            block >>= shift
        return ids.view(np.int64), self.with_ids(0)

    def sorted_groups(self, codes: np.ndarray) -> np.ndarray:
        """Return the group of each of ``codes`` sorted ascending, as int16 (groups are runs: no shift per code)."""
        groups = 1 << self.group_bits
        bounds = np.searchsorted(codes, np.arange(1, groups, dtype=np.uint64) << np.uint64(self.shift("group")))
        return np.repeat(np.arange(groups, dtype=np.int16), np.diff(np.concatenate(([0], bounds, [len(codes)]))))


def _or_groups(codes: np.ndarray, groups: np.ndarray, shift: int) -> None:
    """OR each code's group into its bits from ``shift`` up, in place."""
    n = len(groups)
    if n and bool(np.all(groups[1:] >= groups[:-1])):
        # runs (a mixture's sources, analyzed in order): one constant OR per run, no uint64 copy of the groups
        cuts = np.concatenate(([0], np.flatnonzero(groups[1:] != groups[:-1]) + 1, [n]))
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            codes[a:b] |= np.uint64(int(groups[a]) << shift)
    else:
        codes |= groups.astype(np.uint64) << np.uint64(shift)
