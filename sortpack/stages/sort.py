"""Stage 2: sort the samples globally by (key, sample_id), optionally into curriculum stages.

Keys become uint64 codes (``key_codes``), sorted across ranks by the sample sort
(``sample_sort``), then redistributed so every rank holds whole, position-aligned output
shards. Keys and ids are packed into one uint64 when they fit (one ``np.sort`` of uint64
beats a lexsort many times); otherwise the pair is sorted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..distribute import fetch_rows, global_start, redistribute
from ..errors import SortpackError
from ..parallel import Comm
from ..partition import owner_starts
from ..progress import Progress, phase
from .key_codes import KeyCodec, encode_keys
from .sample_sort import sample_sort
from .samples import SampleColumns


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
class SortedKeys:
    """One rank's range of samples globally sorted by (key code, sample_id)."""

    ids: np.ndarray  # int64 sample ids
    codes: np.ndarray  # uint64 key codes
    payload: dict[str, np.ndarray]  # the columns that travelled along, in the same order


def _sort_by(comm: Comm, codes: np.ndarray, key_bits: int, start: int, total: int, ids: np.ndarray | None,
             payload: dict[str, np.ndarray], contiguous: bool, targets: np.ndarray | None = None) -> SortedKeys:
    """Return the samples sorted by (key code, sample_id) over all ranks.

    ``codes`` is consumed (modified in place). This rank holds global positions from
    ``start`` of ``total``; ``ids=None`` says its ids are ``start + arange(len(codes))``.
    ``targets`` (each rank's first global position, and the total) asks for exactly those
    ranges; it is honoured when keys and ids pack into one uint64 (else ranges are near-even).
    """
    id_bits = max(1, int(total - 1).bit_length())
    if key_bits + id_bits <= 64:
        codes <<= np.uint64(id_bits)
        if ids is None:
            codes |= np.arange(start, start + len(codes), dtype=np.uint64)
        else:
            codes |= ids.astype(np.int64, copy=False).view(np.uint64)
        phase("keys")
        out = sample_sort(comm, codes, None, payload, (start, id_bits) if contiguous else None, targets)
        hi = out.hi
        out_ids = (hi & np.uint64((1 << id_bits) - 1)).view(np.int64)
        hi >>= np.uint64(id_bits)
        return SortedKeys(out_ids, hi, out.payload)
    ids = np.arange(start, start + len(codes), dtype=np.int64) if ids is None else ids.astype(np.int64, copy=False)
    phase("keys")
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
    if samples.begin is not None:
        return _sort_pieces(comm, samples, opts, rows_per_shard, consume, groups)
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
    # each rank's final range of whole output shards: an exact sort lands there, the redistribution is then a no-op
    targets = owner_starts(samples.total, rows_per_shard, comm.size)
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
                       samples.sample_id, payload, False, targets)
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
                       contiguous, targets)
        del ids_in
        ids, codes, payload = out.ids, out.codes, out.payload
        stage = np.zeros(len(ids), np.int16)
        if group_bits:
            # stages == 1: the code is the group; the codes are sorted, so it is runs
            stage = _top_bits(codes, codec.bits, 1 << group_bits)
            codes &= np.uint64((1 << codec.bits) - 1)
        keys = codec.decode(codes, in_place=True)
        del codes
        size = keys if by_size else payload["size"]
        difficulty = keys if not by_size else (size if same else payload["difficulty"])

    del out
    phase("decode")
    start, total = global_start(comm, len(ids))
    ordered = SampleColumns(start, total, ids, size, difficulty, stage if opts.stages > 1 or group_bits else None,
                            files, samples.empty_size)
    del ids, size, difficulty, stage
    cols = redistribute(comm, ordered.columns(), start, owner_starts(total, rows_per_shard, comm.size))
    start, _ = global_start(comm, len(cols["sample_id"]))
    ordered = SampleColumns.from_columns(start, total, cols, files, samples.empty_size)
    phase("redistribute")
    prog.close()
    if ordered.stage is None:
        ordered.stage = np.zeros(len(ordered.sample_id), np.int16)
    return ordered


def _sort_pieces(comm: Comm, samples: SampleColumns, opts: SortOptions, rows_per_shard: int, consume: bool,
                 groups: np.ndarray | None) -> SampleColumns:
    """Return pieces (``--oversize split``) sorted by (key, position), their sample ids and ranges fetched back.

    The pieces of a sample share its id, so the id alone cannot break ties: the pieces are
    sorted by their global positions instead (numbered in (sample, piece) order, a total
    order that does not depend on the rank count), and each sorted position then fetches its
    sample id and range from the rank that held it.
    """
    assert samples.begin is not None
    keep = {"sample_id": samples.sample_id, "begin": samples.begin}
    start, total = samples.start, samples.total
    rows = SampleColumns(start, total, np.arange(start, start + len(samples), dtype=np.int64), samples.size,
                         samples.difficulty, samples.stage, samples.files, samples.empty_size)
    if consume:
        samples.clear()
    ordered = sort_samples(comm, rows, opts, rows_per_shard, consume, groups)
    got = fetch_rows(comm, keep, start, ordered.sample_id)
    ordered.sample_id, ordered.begin = got["sample_id"], got["begin"]
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
    n = len(groups)
    if n and bool(np.all(groups[1:] >= groups[:-1])):
        # runs (a mixture's sources, analyzed in order): one constant OR per run, no uint64 copy of the groups
        cuts = np.concatenate(([0], np.flatnonzero(groups[1:] != groups[:-1]) + 1, [n]))
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            codes[a:b] |= np.uint64(int(groups[a]) << codec.bits)
    else:
        codes |= groups.astype(np.uint64) << np.uint64(codec.bits)
    return codes, codec


def _top_bits(codes: np.ndarray, shift: int, groups: int) -> np.ndarray:
    """Return ``codes >> shift`` as int16 for codes sorted ascending whose top bits hold a group below ``groups``."""
    bounds = np.searchsorted(codes, np.arange(1, groups, dtype=np.uint64) << np.uint64(shift))
    return np.repeat(np.arange(groups, dtype=np.int16), np.diff(np.concatenate(([0], bounds, [len(codes)]))))


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
    return SampleColumns(start, total, ids, size, difficulty, stage, samples.files, samples.empty_size), groups
