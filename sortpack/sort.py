"""Stage 2: distributed sample sort of (key, sample_id).

Local sort, regular samples, Allgather of samples, splitters, Alltoallv (counts, then
payload), merge of the received runs, then a redistribution so every rank holds whole,
position-aligned output shards. Keys and ids are packed into one uint64 when they fit
(one ``np.sort`` of uint64 beats a lexsort many times); otherwise the pair is sorted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels
from .analyze import Samples
from .distribute import global_start, redistribute
from .errors import SortpackError
from .format.shards import owner_starts
from .parallel import Comm, fault_point

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


def _order_preserving_u64(comm: Comm, values: np.ndarray, descending: bool) -> tuple[np.ndarray, int]:
    """Return (uint64 codes whose order is the values' order, bits needed), shifted to start at 0."""
    if values.dtype.kind == "f":
        bits = values.astype(np.float64).view(np.uint64)
        sign = (bits >> np.uint64(63)).astype(bool)
        codes = np.where(sign, ~bits, bits | np.uint64(1 << 63))
    else:
        codes = values.astype(np.uint64)
    if descending:
        codes = ~codes
    lo = comm.allreduce(np.array([codes.min() if codes.size else np.iinfo(np.uint64).max], np.uint64), "min")[0]
    codes = codes - lo
    hi = comm.allreduce(np.array([codes.max() if codes.size else 0], np.uint64), "max")[0]
    return codes, int(hi).bit_length()


def _splitter_cuts(hi: np.ndarray, lo: np.ndarray | None, split_hi: np.ndarray,
                   split_lo: np.ndarray | None) -> np.ndarray:
    """Return the positions of the splitters in locally sorted (hi[, lo]) records."""
    left = np.searchsorted(hi, split_hi, side="left")
    if lo is None:
        return left
    right = np.searchsorted(hi, split_hi, side="right")
    return np.asarray([a + np.searchsorted(lo[a:b], s) for a, b, s in zip(left, right, split_lo)], dtype=np.int64)


def sample_sort(comm: Comm, hi: np.ndarray, lo: np.ndarray | None, payload: dict[str, np.ndarray],
                ids_from: tuple[int, int] | None = None):
    """Return (hi, lo, payload) globally sorted by (hi, lo): rank r holds the r-th range.

    ``lo`` is None when ``hi`` alone is unique (keys packed with ids). For the packed
    form, ``ids_from = (first, id_bits)`` says the low ``id_bits`` bits are the ids
    ``first + arange(n)``: the local sort is then a plain ``np.sort`` and the payload
    follows by the positions read back from the ids (no argsort).
    """
    n = len(hi)
    if lo is None and ids_from is not None:
        hi = np.sort(hi)
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
    if comm.size == 1:
        return hi, lo, payload

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
    offsets = np.concatenate(([0], np.cumsum(recv))).astype(np.int64)
    if r_lo is None:
        r_hi, perm = kernels.merge_sorted_runs(r_hi, offsets)
    else:
        perm = kernels.merge_sorted_runs2(r_hi, r_lo, offsets)
        r_hi, r_lo = r_hi[perm], r_lo[perm]
    return r_hi, r_lo, {k: v[perm] for k, v in r_payload.items()}


def _sort_by(comm: Comm, key_codes: np.ndarray, key_bits: int, samples: Samples,
             payload: dict[str, np.ndarray], contiguous: bool):
    """Return (sample_id, payload) sorted by (key code, sample_id) over all ranks."""
    id_bits = max(1, int(samples.total - 1).bit_length())
    ids = samples.sample_id
    if key_bits + id_bits <= 64:
        packed = (key_codes << np.uint64(id_bits)) | ids.astype(np.uint64)
        hi, _, payload = sample_sort(comm, packed, None, payload,
                                     (samples.start, id_bits) if contiguous else None)
        out_ids = (hi & np.uint64((1 << id_bits) - 1)).astype(np.int64)
        return out_ids, hi >> np.uint64(id_bits), payload
    hi, lo, payload = sample_sort(comm, key_codes, ids.astype(np.uint64), payload)
    return lo.astype(np.int64), hi, payload


def sort_samples(comm: Comm, samples: Samples, opts: SortOptions, rows_per_shard: int) -> Samples:
    """Return the samples globally sorted by (key, sample_id), ranks holding whole output shards."""
    opts.validate()
    contiguous = bool(np.array_equal(samples.sample_id,
                                     np.arange(samples.start, samples.start + len(samples), dtype=np.int64)))
    contiguous = bool(comm.allreduce(int(contiguous), "min"))
    same = samples.difficulty is samples.size or (
        samples.difficulty.dtype == samples.size.dtype and np.array_equal(samples.difficulty, samples.size))
    same = bool(comm.allreduce(int(same), "min"))

    if opts.stages > 1:
        samples = _assign_stages(comm, samples, opts, contiguous)
        contiguous = False
    key = samples.size if opts.key == "size" and opts.stages == 1 else samples.difficulty
    if opts.stages > 1:
        # order inside a stage by size: the stage is the most significant part of the key
        size_codes, size_bits = _order_preserving_u64(comm, samples.size, opts.descending)
        codes = (samples.stage.astype(np.uint64) << np.uint64(size_bits)) | size_codes
        bits = size_bits + max(1, int(opts.stages - 1).bit_length())
    else:
        codes, bits = _order_preserving_u64(comm, key, opts.descending)

    payload = {"size": samples.size}
    if not same or opts.stages > 1:
        payload["difficulty"] = samples.difficulty
    if samples.stage is not None:
        payload["stage"] = samples.stage
    ids, _, payload = _sort_by(comm, codes, bits, samples, payload, contiguous)
    size = payload["size"]
    difficulty = payload.get("difficulty", size)
    stage = payload.get("stage", np.zeros(len(ids), np.int16))

    start, total = global_start(comm, len(ids))
    cols = redistribute(comm, {"sample_id": ids, "size": size, "difficulty": difficulty, "stage": stage},
                        start, owner_starts(total, rows_per_shard, comm.size))
    start, _ = global_start(comm, len(cols["sample_id"]))
    return Samples(start, total, cols["sample_id"], cols["size"], cols["difficulty"], cols["stage"],
                   samples.files)


def _assign_stages(comm: Comm, samples: Samples, opts: SortOptions, contiguous: bool) -> Samples:
    """Return the samples in (difficulty, id) order with stage = exact global quantile bucket."""
    codes, bits = _order_preserving_u64(comm, samples.difficulty, opts.descending)
    payload = {"size": samples.size, "difficulty": samples.difficulty}
    ids, _, payload = _sort_by(comm, codes, bits, samples, payload, contiguous)
    start, total = global_start(comm, len(ids))
    pos = np.arange(start, start + len(ids), dtype=np.int64)
    stage = ((pos * opts.stages) // max(total, 1)).astype(np.int16)
    return Samples(start, total, ids, payload["size"], payload["difficulty"], stage, samples.files)
