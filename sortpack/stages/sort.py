"""Stage 2: sort the samples globally by (key, sample_id), optionally into curriculum stages.

Keys become uint64 codes (``key_codes``), sorted across ranks by the sample sort
(``sample_sort``), then redistributed so every rank holds whole, position-aligned output
shards. Keys and ids are packed into one uint64 when they fit (one ``np.sort`` of uint64
beats a lexsort many times); otherwise the pair is sorted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..distribute import fetch_rows, global_start, redistribute
from ..errors import SortpackError
from ..parallel import Comm
from ..partition import owner_starts
from ..progress import Display, Progress, phase
from .key_codes import KeyCodec, KeyLayout, encode_keys
from .sample_sort import SortHints, sample_sort
from .samples import SampleColumns, measures_in, with_measures
from .sort_plan import curriculum_stages, group_width, id_width, stage_width


@dataclass(frozen=True)
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


class SortedKeys(NamedTuple):
    """One rank's range of samples globally sorted by (key code, sample_id)."""

    ids: np.ndarray  # int64 sample ids
    codes: np.ndarray  # uint64 key codes
    payload: dict[str, np.ndarray]  # the columns that travelled along, in the same order


class _Keys(NamedTuple):
    """The key codes one sort packs (``layout`` says their fields, without ids): consumed, the stage and group
    (either may be None) packed into them in place."""

    codes: np.ndarray
    layout: KeyLayout
    stage: np.ndarray | None = None
    group: np.ndarray | None = None
    room: np.ndarray | None = None  # the buffer the codes are the start of (``SortHints.room``)


class _Rows(NamedTuple):
    """The rows going into one sort: this rank's global positions from ``start`` of ``total``, their ids
    (None: ``start + arange(n)``) and the columns that travel with them."""

    start: int
    total: int
    ids: np.ndarray | None
    payload: dict[str, np.ndarray]


class _Facts(NamedTuple):
    """What every rank knows of a sort before anything moves: the options, whether the ids are contiguous and
    the difficulty is the size (``_is_contiguous``, ``_is_same``), the group bits, each rank's target range."""

    opts: SortOptions
    contiguous: bool
    same: bool
    group_bits: int
    targets: np.ndarray
    consume: bool


def _sort_by(comm: Comm, keys: _Keys, rows: _Rows, contiguous: bool, targets: np.ndarray | None = None
             ) -> SortedKeys:
    """Return the rows sorted by (group, stage, key code, sample_id) over all ranks.

    ``keys.codes`` is consumed: the stage and group are packed into it in place. ``contiguous``:
    every rank's ids are its positions (then the payload follows the ids, no argsort).
    ``targets`` (each rank's first global position, and the total) asks for exactly those
    ranges; it is honoured when keys and ids pack into one uint64 (else ranges are near-even).
    The returned codes hold ``keys.layout``'s fields, the ids shifted out.
    """
    start, ids, layout = rows.start, rows.ids, keys.layout
    # ids are below the total, but the numbers of pieces out of (sample id, begin) order are not (``_piece_numbers``)
    top = rows.total if ids is None else comm.allreduce(int(ids.max()) + 1 if len(ids) else 0, "max")
    packed = layout.with_ids(id_width(max(rows.total, top)))
    if packed.fits():
        codes = packed.pack_into(keys.codes, stage=keys.stage, group=keys.group, ids=ids,
                                 first_id=start if ids is None else None)
        phase("keys")
        hints = SortHints((start, packed) if contiguous else None, targets, keys.room)
        out = sample_sort(comm, codes, None, rows.payload, hints)
        out_ids, _ = packed.strip_ids(out.hi, into=out.spare)
        return SortedKeys(out_ids, out.hi, out.payload)
    codes = layout.pack_into(keys.codes, stage=keys.stage, group=keys.group)
    ids = np.arange(start, start + len(codes), dtype=np.int64) if ids is None else ids.astype(np.int64, copy=False)
    phase("keys")
    out = sample_sort(comm, codes, ids.view(np.uint64), rows.payload)
    assert out.lo is not None  # sorted as (key, id) pairs: lo holds the ids
    return SortedKeys(out.lo.view(np.int64), out.hi, out.payload)


def _is_contiguous(comm: Comm, samples: SampleColumns) -> bool:
    """Return whether every rank's ids are ``start + arange(n)`` (then positions come from ids)."""
    ids, n = samples.sample_id, len(samples.sample_id)
    ok = n == 0 or (int(ids[0]) == samples.start and int(ids[-1]) == samples.start + n - 1 and _rising(ids))
    return bool(comm.allreduce(int(ok), "min"))


def _rising(ids: np.ndarray, block: int = 1 << 20) -> bool:
    """Return whether ``ids`` strictly rise, a block at a time (no mask as long as the ids)."""
    last = len(ids) - 1  # pairs (i, i + 1) for i below it
    return all(bool(np.all(ids[a + 1:min(a + block, last) + 1] > ids[a:min(a + block, last)]))
               for a in range(0, last, block))


def _is_same(comm: Comm, samples: SampleColumns) -> bool:
    """Return whether every rank's difficulty is its size (then one of them travels)."""
    same = samples.difficulty is samples.size or (
        samples.difficulty.dtype == samples.size.dtype and np.array_equal(samples.difficulty, samples.size))
    return bool(comm.allreduce(int(same), "min"))


class _Sorted(NamedTuple):
    """One rank's sorted columns before the redistribution (``stage`` None: no stages and no groups)."""

    ids: np.ndarray
    size: np.ndarray
    difficulty: np.ndarray
    stage: np.ndarray | None
    measures: dict[str, np.ndarray]


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
        # pieces share their sample's id: sorted by (sample id, begin) numbers, their ids and ranges recovered
        start = samples.start
        rows, keep, shift = _piece_numbers(comm, samples, consume)
        ordered = sort_samples(comm, rows, opts, rows_per_shard, consume, groups)
        if shift is None:
            got = fetch_rows(comm, keep, start, ordered.sample_id)
            ordered.sample_id, ordered.begin = got["sample_id"], got["begin"]
        else:
            numbers = ordered.sample_id
            ordered.sample_id, ordered.begin = numbers >> shift, numbers & ((1 << shift) - 1)
        return ordered
    group_bits = 0
    if groups is not None:
        group_bits = group_width(comm.allreduce(int(groups.max()) if len(groups) else 0, "max"))
    files, total = samples.files, samples.total
    prog = Progress("sort", None, "phases", display=Display(ranks=comm.size))
    # each rank's final range of whole output shards: an exact sort lands there, the redistribution is then a no-op
    facts = _Facts(opts, _is_contiguous(comm, samples), _is_same(comm, samples), group_bits,
                   owner_starts(total, rows_per_shard, comm.size), consume)
    if opts.stages > 1:
        samples, groups = _assign_stages(comm, samples, groups, facts)
        out = _sort_staged(comm, samples, groups, facts)
    else:
        out = _sort_plain(comm, samples, groups, facts)
    phase("decode")
    start, total = global_start(comm, len(out.ids))
    ordered = SampleColumns(start, total, out.ids, out.size, out.difficulty, out.stage, files, samples.empty_size,
                            measures=out.measures)
    del out
    cols = redistribute(comm, ordered.columns(), start, owner_starts(total, rows_per_shard, comm.size))
    start, _ = global_start(comm, len(cols["sample_id"]))
    ordered = SampleColumns.from_columns(start, total, cols, files, samples.empty_size)
    phase("redistribute")
    prog.close()
    if ordered.stage is None:
        ordered.stage = np.zeros(len(ordered.sample_id), np.int16)
    return ordered


def _sort_staged(comm: Comm, samples: SampleColumns, groups: np.ndarray | None, facts: _Facts) -> _Sorted:
    """Return samples already staged (``_assign_stages``) sorted by ((group,) stage, size, id)."""
    opts = facts.opts
    # order inside a stage by size: the stage is the most significant part of the key below the group
    codes, codec = encode_keys(comm, samples.size, opts.descending)
    layout = KeyLayout(codec.bits, stage_width(opts.stages), facts.group_bits)
    payload = with_measures({} if facts.same else {"difficulty": samples.difficulty}, samples.measures)
    out = _sort_by(comm, _Keys(codes, layout, samples.stage_or_zero(), groups),
                   _Rows(samples.start, samples.total, samples.sample_id, payload), False, facts.targets)
    stage = layout.field(out.codes, "stage").astype(np.int16)
    if facts.group_bits:
        stage += layout.field(out.codes, "group").astype(np.int16) * np.int16(opts.stages)
    size = codec.decode(layout.field(out.codes, "key"))
    return _Sorted(out.ids, size, out.payload.get("difficulty", size), stage, measures_in(out.payload))


def _sort_plain(comm: Comm, samples: SampleColumns, groups: np.ndarray | None, facts: _Facts) -> _Sorted:
    """Return the samples sorted by ((group,) key, id), one curriculum stage (the group, if any, as the stage)."""
    opts, same = facts.opts, facts.same
    by_size = opts.key == "size"
    payload: dict[str, np.ndarray] = {}
    if not by_size:
        payload["size"] = samples.size
    elif not same:
        payload["difficulty"] = samples.difficulty
    payload = with_measures(payload, samples.measures)
    ids_in: np.ndarray | None = samples.sample_id
    free_input = facts.consume and not payload and facts.contiguous
    if free_input:
        # the ids are start + arange(n): free them before the codes are made, which then take their memory
        samples.sample_id, ids_in = np.zeros(0, np.int64), None
    # the codes' buffer holds this rank's whole target range: the sort receives into it (no fresh array)
    mine = int(facts.targets[comm.rank + 1] - facts.targets[comm.rank])
    room = np.empty(max(len(samples.size), mine), np.uint64)
    codes, codec = encode_keys(comm, samples.size if by_size else samples.difficulty, opts.descending, out=room)
    layout = _group_layout(codec, facts.group_bits)
    if free_input:
        # the keys are in the codes: free the input now
        samples.clear()
    out = _sort_by(comm, _Keys(codes, layout, group=groups, room=room),
                   _Rows(samples.start, samples.total, ids_in, payload), facts.contiguous, facts.targets)
    del room
    del ids_in
    ids, codes, payload = out.ids, out.codes, out.payload
    del out
    stage = None
    if facts.group_bits:
        # stages == 1: the code is the group; the codes are sorted, so it is runs
        stage = layout.sorted_groups(codes)
        codes = layout.field(codes, "key", in_place=True)
    keys = codec.decode(codes, in_place=True)
    del codes
    size = keys if by_size else payload["size"]
    difficulty = keys if not by_size else (size if same else payload["difficulty"])
    return _Sorted(ids, size, difficulty, stage, measures_in(payload))


def _in_piece_order(comm: Comm, sample_id: np.ndarray, begin: np.ndarray) -> bool:
    """Return whether the pieces (every rank's, in rank order) are in strictly ascending (sample id, begin) order."""
    later = (sample_id[1:] > sample_id[:-1]) | ((sample_id[1:] == sample_id[:-1]) & (begin[1:] > begin[:-1]))
    mine = bool(np.all(later))
    ends = comm.allgather_obj(((int(sample_id[0]), int(begin[0])), (int(sample_id[-1]), int(begin[-1])))
                              if len(sample_id) else None)
    ends = [e for e in ends if e is not None]
    return bool(comm.allreduce(int(mine), "min")) and all(a[1] < b[0] for a, b in zip(ends, ends[1:]))


def _piece_numbers(comm: Comm, samples: SampleColumns, consume: bool
                   ) -> tuple[SampleColumns, dict[str, np.ndarray], int | None]:
    """Return pieces (``--oversize split``) numbered in (sample id, begin) order in place of their ids, what
    recovers their ids and begins after the sort, and how (``consume``: ``samples`` is emptied).

    The pieces of a sample share its id, so the id alone cannot break ties. (sample id, begin) is a
    total order that neither the rank count nor the route that cut the pieces changes: ``run`` cuts
    samples in id order, ``pack`` of a sorted directory in sorted order, and both must give the same
    plan. Pieces already in that order (``run``) are numbered by global position (the shift is None:
    their ids and begins are fetched back by position); others by ``(sample_id << shift) | begin``,
    decoded after the sort.
    """
    assert samples.begin is not None
    keep: dict[str, np.ndarray] = {}
    start, total = samples.start, samples.total
    shift = None
    if not _in_piece_order(comm, samples.sample_id, samples.begin):
        top_id = comm.allreduce(int(samples.sample_id.max()) if len(samples) else 0, "max")
        shift = max(comm.allreduce(int(samples.begin.max()) if len(samples) else 0, "max").bit_length(), 1)
        if top_id.bit_length() + shift > 62:  # every rank sees the same maxima: all raise together
            raise SortpackError(f"pieces of samples up to id {top_id} with ranges up to {1 << shift} units do not fit "
                                "one 64-bit number in (sample, begin) order; split them with sortpack run",
                                collective=True)
        numbers = (samples.sample_id.astype(np.int64) << shift) | samples.begin.astype(np.int64)
    else:
        keep = {"sample_id": samples.sample_id, "begin": samples.begin}
        numbers = np.arange(start, start + len(samples), dtype=np.int64)
    rows = SampleColumns(start, total, numbers, samples.size, samples.difficulty, samples.stage, samples.files,
                         samples.empty_size, measures=samples.measures)
    if consume:
        samples.clear()
    return rows, keep, shift


def _group_layout(codec: KeyCodec, group_bits: int) -> KeyLayout:
    """Return the key layout of (group, key) codes, refusing (every rank alike) a key too wide to share 64 bits."""
    layout = KeyLayout(codec.bits, group_bits=group_bits)
    if group_bits and not layout.fits():
        # every rank sees the same codec: all raise together
        raise SortpackError(f"the sort key's values span {codec.bits} bits, too wide to sort within "
                            f"{1 << group_bits} mixture sources in one 64-bit key; rescale --difficulty",
                            collective=True)
    return layout


def _assign_stages(comm: Comm, samples: SampleColumns, groups: np.ndarray | None,
                   facts: _Facts) -> tuple[SampleColumns, np.ndarray | None]:
    """Return the samples in ((group,) difficulty, id) order with stage = exact quantile bucket (within its group).

    The groups come back in the new order (None without groups).
    """
    opts, same, group_bits = facts.opts, facts.same, facts.group_bits
    codes, codec = encode_keys(comm, samples.difficulty, opts.descending)
    layout = _group_layout(codec, group_bits)
    payload = with_measures({} if same else {"size": samples.size}, samples.measures)
    out = _sort_by(comm, _Keys(codes, layout, group=groups),
                   _Rows(samples.start, samples.total, samples.sample_id, payload), facts.contiguous)
    ids, codes, payload = out.ids, out.codes, out.payload
    start, total = global_start(comm, len(ids))
    pos = np.arange(start, start + len(ids), dtype=np.int64)
    if groups is None:
        difficulty = codec.decode(codes)
        stage = curriculum_stages(pos, opts.stages, total)
    else:
        groups = layout.field(codes, "group").astype(np.int64)
        difficulty = codec.decode(layout.field(codes, "key"))
        counts = comm.allreduce(np.bincount(groups, minlength=1 << group_bits).astype(np.int64), "sum")
        stage = curriculum_stages(pos, opts.stages, total, groups, counts)
    size = difficulty if same else payload["size"]
    return SampleColumns(start, total, ids, size, difficulty, stage, samples.files, samples.empty_size,
                         measures=measures_in(payload)), groups
