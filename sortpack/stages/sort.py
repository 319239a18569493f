"""Stage 2: distributed sample sort of (key, sample_id).

Local sort, regular samples, Allgather of samples, splitters, Alltoallv (counts, then
payload), merge of the received runs, then a redistribution so every rank holds whole,
position-aligned output shards. Keys and ids are packed into one uint64 when they fit
(one ``np.sort`` of uint64 beats a lexsort many times); otherwise the pair is sorted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..distribute import global_start, redistribute
from ..errors import SortpackError
from ..parallel import Comm, fault_point
from ..partition import owner_starts
from ..progress import Progress, phase
from .samples import SampleColumns

SAMPLES_PER_RANK = 1024  # regular samples each rank contributes to choose splitters


@dataclass
class SortOptions:
    """How to order samples: by which key, which direction, how many curriculum stages."""

    key: str = "size"
    descending: bool = False
    stages: int = 1

    def validate(self) -> None:
        """Raise SortpackError for option values that make no sense."""
        if self.key not in ("size", "difficulty"):
            raise SortpackError(f"--key {self.key!r}: expected size or difficulty")
        if self.stages < 1:
            raise SortpackError(f"--stages {self.stages}: must be at least 1")

    def as_dict(self) -> dict:
        """Return the options as recorded in manifests."""
        return {"key": self.key, "descending": self.descending, "stages": self.stages}


@dataclass
class SortedRecords:
    """One rank's range of records globally sorted by (hi, lo), with the payload in the same order."""

    hi: np.ndarray
    lo: np.ndarray | None  # None when hi alone is unique (keys packed with ids)
    payload: dict[str, np.ndarray]


@dataclass
class SortedKeys:
    """One rank's range of samples globally sorted by (key code, sample_id)."""

    ids: np.ndarray  # int64 sample ids
    codes: np.ndarray  # uint64 key codes
    payload: dict[str, np.ndarray]  # the columns that travelled along, in the same order


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


def _splitter_cuts(hi: np.ndarray, lo: np.ndarray | None, split_hi: np.ndarray,
                   split_lo: np.ndarray | None) -> np.ndarray:
    """Return the positions of the splitters in locally sorted (hi[, lo]) records."""
    left = np.searchsorted(hi, split_hi, side="left")
    if lo is None or split_lo is None:  # both or neither: records and splitters come from the same sort
        return left
    right = np.searchsorted(hi, split_hi, side="right")
    return np.asarray([a + np.searchsorted(lo[a:b], s) for a, b, s in zip(left, right, split_lo)], dtype=np.int64)


def sample_sort(comm: Comm, hi: np.ndarray, lo: np.ndarray | None, payload: dict[str, np.ndarray],
                ids_from: tuple[int, int] | None = None) -> SortedRecords:
    """Return the records globally sorted by (hi, lo): rank r holds the r-th range.

    ``lo`` is None when ``hi`` alone is unique (keys packed with ids). For the packed
    form, ``ids_from = (first, id_bits)`` says the low ``id_bits`` bits are the ids
    ``first + arange(n)``: the local sort is then a plain ``np.sort`` and the payload
    follows by the positions read back from the ids (no argsort).
    """
    n = len(hi)
    if lo is None and ids_from is not None:
        hi.sort()
        if payload:
            first, id_bits = ids_from
            pos = (hi & np.uint64((1 << id_bits) - 1)).astype(np.int64) - first
            payload = {k: v[pos] for k, v in payload.items()}
    else:
        order = np.argsort(hi, kind="stable") if lo is None else np.lexsort((lo, hi))
        hi = hi[order]
        lo = None if lo is None else lo[order]
        payload = {k: v[order] for k, v in payload.items()}
    fault_point(comm, "sort")
    phase("local sort")
    if comm.size == 1:
        return SortedRecords(hi, lo, payload)

    take = min(n, SAMPLES_PER_RANK)
    idx = ((np.arange(take, dtype=np.int64) + 1) * n) // (take + 1)
    s_hi = comm.allgatherv(hi[idx])
    s_lo = comm.allgatherv(lo[idx]) if lo is not None else None
    s_order = np.argsort(s_hi, kind="stable") if s_lo is None else np.lexsort((s_lo, s_hi))
    pick = s_order[(np.arange(1, comm.size, dtype=np.int64) * len(s_order)) // comm.size] \
        if len(s_order) else np.zeros(0, np.int64)
    split_hi = s_hi[pick]
    split_lo = s_lo[pick] if s_lo is not None else None
    cuts = np.concatenate(([0], _splitter_cuts(hi, lo, split_hi, split_lo) if len(pick) else
                           np.zeros(comm.size - 1, np.int64), [n]))
    send = np.diff(cuts)
    recv = comm.exchange_counts(send)
    r_hi = comm.alltoallv(hi, send, recv)
    r_lo = comm.alltoallv(lo, send, recv) if lo is not None else None
    r_payload = {k: comm.alltoallv(v, send, recv) for k, v in payload.items()}
    phase("exchange")
    offsets = np.concatenate(([0], np.cumsum(recv))).astype(np.int64)
    if r_lo is None and not r_payload:
        # nothing rides along: merge the sorted runs in place (timsort finds the runs)
        r_hi.sort(kind="stable")
        return SortedRecords(r_hi, None, {})
    if r_lo is None:
        r_hi, perm = kernels.merge_sorted_runs(r_hi, offsets)
    else:
        perm = kernels.merge_sorted_runs2(r_hi, r_lo, offsets)
        r_hi, r_lo = r_hi[perm], r_lo[perm]
    return SortedRecords(r_hi, r_lo, {k: v[perm] for k, v in r_payload.items()})


def _sort_by(comm: Comm, codes: np.ndarray, key_bits: int, start: int, total: int, ids: np.ndarray | None,
             payload: dict[str, np.ndarray], contiguous: bool) -> SortedKeys:
    """Return the samples sorted by (key code, sample_id) over all ranks.

    ``codes`` is consumed (modified in place). This rank holds global positions from
    ``start`` of ``total``; ``ids=None`` says its ids are ``start + arange(len(codes))``.
    """
    id_bits = max(1, int(total - 1).bit_length())
    if key_bits + id_bits <= 64:
        codes <<= np.uint64(id_bits)
        if ids is None:
            codes |= np.arange(start, start + len(codes), dtype=np.uint64)
        else:
            codes |= ids.astype(np.int64, copy=False).view(np.uint64)
        out = sample_sort(comm, codes, None, payload, (start, id_bits) if contiguous else None)
        hi = out.hi
        out_ids = (hi & np.uint64((1 << id_bits) - 1)).view(np.int64)
        hi >>= np.uint64(id_bits)
        return SortedKeys(out_ids, hi, out.payload)
    ids = np.arange(start, start + len(codes), dtype=np.int64) if ids is None else ids.astype(np.int64, copy=False)
    out = sample_sort(comm, codes, ids.view(np.uint64), payload)
    assert out.lo is not None  # sorted as (key, id) pairs: lo holds the ids
    return SortedKeys(out.lo.view(np.int64), out.hi, out.payload)


def _is_contiguous(comm: Comm, samples: SampleColumns) -> bool:
    """Return whether every rank's ids are ``start + arange(n)`` (then positions come from ids)."""
    ids, n = samples.sample_id, len(samples.sample_id)
    ok = n == 0 or (int(ids[0]) == samples.start and int(ids[-1]) == samples.start + n - 1
                    and bool(np.all(ids[1:] > ids[:-1])))
    return bool(comm.allreduce(int(ok), "min"))


def sort_samples(comm: Comm, samples: SampleColumns, opts: SortOptions, rows_per_shard: int,
                 consume: bool = False, groups: np.ndarray | None = None) -> SampleColumns:
    """Return the samples globally sorted by (key, sample_id), ranks holding whole output shards.

    Keys travel packed with the ids and are decoded afterwards, so with the default key
    (size, difficulty = size) nothing but one uint64 per sample is moved or gathered.
    ``consume=True`` lets the sort drop the input arrays as soon as they are encoded
    (the caller's ``samples`` is emptied), which bounds a rank's peak memory.
    ``groups`` (small non-negative ints per sample, a mixture's sources) sorts by
    (group, key, sample_id) in the same one sort; curriculum stages are then quantiles within
    each group, and the returned ``stage`` is ``group * opts.stages + stage`` (the group read
    back from the key's top bits, so it costs no extra column in the sort).
    """
    opts.validate()
    group_bits = 0
    if groups is not None:
        group_bits = max(1, int(comm.allreduce(int(groups.max()) if len(groups) else 0, "max")).bit_length())
    files = samples.files
    prog = Progress("sort", None, "phases", ranks=comm.size)
    contiguous = _is_contiguous(comm, samples)
    same = samples.difficulty is samples.size or (
        samples.difficulty.dtype == samples.size.dtype and np.array_equal(samples.difficulty, samples.size))
    same = bool(comm.allreduce(int(same), "min"))
    payload: dict[str, np.ndarray] = {}
    if opts.stages > 1:
        samples, groups = _assign_stages(comm, samples, opts, contiguous, same, groups, group_bits)
        contiguous = False
        # order inside a stage by size: the stage is the most significant part of the key
        codes, codec = encode_keys(comm, samples.size, opts.descending)
        stage_bits = max(1, int(opts.stages - 1).bit_length())
        codes |= samples.stage_or_zero().astype(np.uint64) << np.uint64(codec.bits)
        if groups is not None:
            codes |= groups.astype(np.uint64) << np.uint64(codec.bits + stage_bits)
        if not same:
            payload["difficulty"] = samples.difficulty
        out = _sort_by(comm, codes, codec.bits + stage_bits + group_bits, samples.start, samples.total,
                       samples.sample_id, payload, False)
        ids, codes, payload = out.ids, out.codes, out.payload
        stage = ((codes >> np.uint64(codec.bits)) & np.uint64((1 << stage_bits) - 1)).astype(np.int16)
        if group_bits:
            group = (codes >> np.uint64(codec.bits + stage_bits)).astype(np.int16)
            stage += group * np.int16(opts.stages)
        size = codec.decode(codes & np.uint64((1 << codec.bits) - 1))
        difficulty = payload.get("difficulty", size)
    else:
        by_size = opts.key == "size"
        codes, codec = encode_keys(comm, samples.size if by_size else samples.difficulty, opts.descending)
        codes, codec = _with_groups(codes, codec, groups, group_bits)
        if not by_size:
            payload["size"] = samples.size
        elif not same:
            payload["difficulty"] = samples.difficulty
        ids_in: np.ndarray | None = samples.sample_id
        if consume and not payload and contiguous:
            # the ids are start + arange(n) and the keys are in the codes: free the input now
            samples.clear()
            ids_in = None
        out = _sort_by(comm, codes, codec.bits + group_bits, samples.start, samples.total, ids_in, payload,
                       contiguous)
        del ids_in
        ids, codes, payload = out.ids, out.codes, out.payload
        stage = np.zeros(len(ids), np.int16)
        if group_bits:
            stage = (codes >> np.uint64(codec.bits)).astype(np.int16)  # stages == 1: the code is the group
            codes &= np.uint64((1 << codec.bits) - 1)
        keys = codec.decode(codes, in_place=True)
        del codes
        size = keys if by_size else payload["size"]
        difficulty = keys if not by_size else (size if same else payload["difficulty"])

    del out
    start, total = global_start(comm, len(ids))
    ordered = SampleColumns(start, total, ids, size, difficulty, stage if opts.stages > 1 or group_bits else None,
                            files)
    del ids, size, difficulty, stage
    cols = redistribute(comm, ordered.columns(), start, owner_starts(total, rows_per_shard, comm.size))
    start, _ = global_start(comm, len(cols["sample_id"]))
    ordered = SampleColumns.from_columns(start, total, cols, files)
    prog.update(1, phase="redistribute")
    prog.close()
    if ordered.stage is None:
        ordered.stage = np.zeros(len(ordered.sample_id), np.int16)
    return ordered


def _with_groups(codes: np.ndarray, codec: KeyCodec, groups: np.ndarray | None,
                 group_bits: int) -> tuple[np.ndarray, KeyCodec]:
    """Return the key codes with the group in the bits above them (the codec still decodes the key alone)."""
    if groups is None:
        return codes, codec
    if codec.bits + group_bits > 64:
        # every rank sees the same codec: all raise together
        raise SortpackError(f"the sort key's values span {codec.bits} bits, too wide to sort within "
                            f"{1 << group_bits} mixture sources in one 64-bit key; rescale --difficulty",
                            collective=True)
    codes |= groups.astype(np.uint64) << np.uint64(codec.bits)
    return codes, codec


def _assign_stages(comm: Comm, samples: SampleColumns, opts: SortOptions, contiguous: bool, same: bool,
                   groups: np.ndarray | None = None, group_bits: int = 0) -> tuple[SampleColumns, np.ndarray | None]:
    """Return the samples in ((group,) difficulty, id) order with stage = exact quantile bucket (within its group).

    The groups come back in the new order (None without groups).
    """
    codes, codec = encode_keys(comm, samples.difficulty, opts.descending)
    codes, codec = _with_groups(codes, codec, groups, group_bits)
    out = _sort_by(comm, codes, codec.bits + group_bits, samples.start, samples.total, samples.sample_id,
                   {} if same else {"size": samples.size}, contiguous)
    ids, codes, payload = out.ids, out.codes, out.payload
    start, total = global_start(comm, len(ids))
    pos = np.arange(start, start + len(ids), dtype=np.int64)
    if groups is None:
        difficulty = codec.decode(codes)
        stage = ((pos * opts.stages) // max(total, 1)).astype(np.int16)
    else:
        groups = (codes >> np.uint64(codec.bits)).astype(np.int64)
        difficulty = codec.decode(codes & np.uint64((1 << codec.bits) - 1))
        width = 1 << group_bits
        counts = comm.allreduce(np.bincount(groups, minlength=width).astype(np.int64), "sum")
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        stage = (((pos - first[groups]) * opts.stages) // np.maximum(counts[groups], 1)).astype(np.int16)
    size = difficulty if same else payload["size"]
    return SampleColumns(start, total, ids, size, difficulty, stage, samples.files), groups
