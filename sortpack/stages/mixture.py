"""The mixture stage: a union of sources sorted as one, packed, blended and moved to its writers.

``pipeline.mixture`` strings these together (docs/mixtures.md). The pure halves work on
numpy arrays and take ``rank=``/``size=`` where a rank's share matters, so they are tested
without MPI (tests/stages/test_mixture_stage.py); the communicating halves gather a few numbers
per micro-batch (never per sample) or move one Alltoallv of sample ids.

- **union**: sources analyzed apart are numbered contiguously per rank for the sort
  (``union_sources``), with a segment table that maps the contiguous numbers back to global
  sample ids after it (``global_ids``); sources analyzed together are one input already
  (``source_bases``, ``source_of``).
- **packed units**: every rank gathers every packed micro-batch's tokens, samples, source and
  stage (``gather_packed``); the part passes are chosen from them (``choose_part_passes``)
  and packed after the whole packing (``pack_part_passes``).
- **blend**: the units blended into the plan order (``blend_units``), the plan's micro-batches
  moved to the ranks that write their index shards (``move_to_writers``), and the manifest's
  ``mixture`` record (``mixture_record``); ``blend_mixture`` does the three.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..errors import SortpackError
from ..inputs.mixture import Mixture
from ..inputs.schedule import deviations
from ..parallel import Comm
from ..partition import balanced_blocks, index_shard_layout
from .blend import Blend, pass_needs, plan_blend
from .holdout import DEFAULT_SEED, Holdout
from .pack import Microbatches, PackOptions, microbatch_stats, pack_samples
from .part_pass import part_pass_samples
from .plan_options import PlanOptions
from .samples import SampleColumns
from .split import ByteCuts, split_oversize

__all__ = ["PackedUnits", "blend_mixture", "blend_units", "choose_part_passes", "concat_microbatches",
           "gather_packed", "global_ids",
           "held_tokens", "holdout_plan", "mixture_record", "move_plan", "move_to_writers", "pack_part_passes",
           "piece_sources", "plan_order", "segment_table", "source_bases", "source_of", "split_source", "split_union",
           "take_runs",
           "union_segments", "union_sources"]


# --- the union -----------------------------------------------------------------------------

def source_bases(file_rows: np.ndarray, file_counts: list[int], names: list[str]) -> np.ndarray:
    """Return each source's first global sample id plus the end, from its files' rows (one-line error: an empty source).

    The sources' files are in order: ``file_counts[k]`` of ``file_rows`` are source k's.
    """
    file_first = np.concatenate(([0], np.cumsum(file_counts))).astype(np.int64)
    file_rows = np.asarray(file_rows, dtype=np.int64)
    rows = np.array([file_rows[file_first[k]:file_first[k + 1]].sum() for k in range(len(file_counts))], np.int64)
    empty = np.flatnonzero(rows == 0)
    if len(empty):
        raise SortpackError(f"mixture source {names[int(empty[0])]!r}: its inputs hold no rows", collective=True)
    return np.concatenate(([0], np.cumsum(rows)))


def source_of(samples: SampleColumns, bases: np.ndarray) -> np.ndarray:
    """Return the source of each of this rank's contiguous samples (int16)."""
    n = len(samples)
    cuts = np.clip(bases - samples.start, 0, n)
    return np.repeat(np.arange(len(bases) - 1, dtype=np.int16), np.diff(cuts))


def union_segments(starts: list[int], counts: list[int], bases: np.ndarray, vstart: int) -> list[tuple[int, int, int]]:
    """Return this rank's segments (contiguous start, global id start, count) of its sources' runs.

    Source k's run holds ``counts[k]`` samples from its own position ``starts[k]``; this rank
    numbers its runs contiguously from ``vstart``. Empty runs have no segment.
    """
    local = np.concatenate(([0], np.cumsum(counts)))[:-1] + vstart
    return [(int(local[k]), int(bases[k] + starts[k]), int(counts[k])) for k in range(len(counts)) if counts[k]]


def segment_table(segments: list[list[tuple[int, int, int]]]) -> np.ndarray:
    """Return every rank's segments as one table sorted by contiguous start (one empty row when there are none)."""
    table = np.array([s for part in segments for s in part] or [(0, 0, 0)], dtype=np.int64)
    return table[np.argsort(table[:, 0], kind="stable")]


def union_sources(comm: Comm, parts: list[SampleColumns]
                  ) -> tuple[SampleColumns, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
    """Return (the union numbered contiguously per rank, its groups, the segment table, source bases, files).

    The segment table (rows: contiguous start, global id start, count) maps the contiguous
    numbering back to global ids (``global_ids``); ``bases[k]`` is source k's first global id.
    """
    rows = np.array([p.total for p in parts], dtype=np.int64)
    bases = np.concatenate(([0], np.cumsum(rows)))
    n = [len(p) for p in parts]
    mine = int(sum(n))
    vstart = comm.exscan(mine)
    segs = union_segments([p.start for p in parts], n, bases, vstart)
    table = segment_table(comm.allgather_obj(segs))
    size = np.concatenate([p.size for p in parts]) if parts else np.zeros(0, np.int64)
    if comm.allreduce(int(all(p.difficulty is p.size for p in parts)), "min"):
        difficulty = size
    else:
        is_float = comm.allreduce(int(any(p.difficulty.dtype.kind == "f" for p in parts)), "max")
        dtype = np.float64 if is_float else np.int64
        difficulty = np.concatenate([p.difficulty.astype(dtype, copy=False) for p in parts])
    groups = np.repeat(np.arange(len(parts), dtype=np.int64), n)
    files = [f for p in parts for f in p.files]
    total = int(rows.sum())
    union = SampleColumns(vstart, total, np.arange(vstart, vstart + mine, dtype=np.int64), size, difficulty, None,
                          files, max((p.empty_size for p in parts), default=0), measures=union_measures(comm, parts))
    return union, groups, table, bases, files


def union_measures(comm: Comm, parts: list[SampleColumns]) -> dict[str, np.ndarray]:
    """Return the sources' measures concatenated in source order (every source must measure the same ones)."""
    names = sorted({k for p in parts for k in p.measures})
    for k, p in enumerate(parts):
        missing = [n for n in names if n not in p.measures]
        if missing:  # the same options on every rank: all raise together
            raise SortpackError(f"mixture source {k} has no measure {missing[0]} (every source must measure it)",
                                collective=True)
    return {n: np.concatenate([p.measures[n] for p in parts]) if parts else np.zeros(0, np.int64) for n in names}


def global_ids(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Return the global ids of contiguous-numbering ids (``union_sources``'s table), in place."""
    seg = np.searchsorted(table[:, 0], ids, side="right") - 1
    ids += (table[:, 1] - table[:, 0])[seg]
    return ids


def piece_sources(sample_id: np.ndarray, bases: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
    """Return the source (int64) of each sample or piece of the union from its sample id (pure).

    ``table`` (sources analyzed apart): the ids are the union's contiguous numbers, mapped to
    global ids first (``global_ids``); ``bases`` are the sources' first global ids plus the end.
    """
    ids = np.asarray(sample_id, dtype=np.int64)
    if table is not None:
        ids = global_ids(table, ids.copy())
    return (np.searchsorted(bases, ids, side="right") - 1).astype(np.int64)


def split_union(comm: Comm, union: SampleColumns, groups: np.ndarray, table: np.ndarray | None, bases: np.ndarray,
                plan: PlanOptions, known: ByteCuts | None = None,
                holdout: Holdout | None = None) -> tuple[SampleColumns, np.ndarray, dict]:
    """Return (the union with every sample over the budget cut into pieces, their sources, the split's counts).

    Cut right after analyze, before the sort, as ``run`` cuts (``stages.split``): a piece is a
    sample of its document's source, sorted by its own size. ``plan`` and ``known`` as for
    ``split_oversize`` (``--size bytes``: the column cut between characters, the cuts analyze
    placed). ``holdout``: the counts are the training plan's documents', ``split["held"]`` the
    held-out plan's. Collective.
    """
    held_out = None
    if holdout is not None:
        def held_out(ids: np.ndarray) -> np.ndarray:
            return holdout.mask(ids if table is None else global_ids(table, ids.copy()))
    union, split = split_oversize(comm, union, plan, known, held_out)
    if union.begin is not None:  # pieces: one source per piece, from its document's id
        groups = piece_sources(union.sample_id, bases, table)
    return union, groups, split


def holdout_plan(mix: Mixture, value: int | float | None, seed: int | None, bases: np.ndarray) -> Holdout | None:
    """Return what each source holds out: its own ``holdout``, else ``value`` (--holdout; None: nothing anywhere).

    ``seed`` is --holdout-seed (None: MIX.json's ``holdout_seed``, else the default seed).
    """
    requests = [src.holdout if src.holdout is not None else value for src in mix.sources]
    seed = seed if seed is not None else mix.holdout_seed
    return Holdout.plan(requests, bases, list(mix.names), DEFAULT_SEED if seed is None else seed,
                        what="--holdout" if any(src.holdout is None for src in mix.sources) else "holdout")


# --- the packed units ----------------------------------------------------------------------

def take_runs(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Return ``values[starts[i] : starts[i] + lengths[i]]`` of every i, concatenated (one memcpy per run)."""
    values = np.ascontiguousarray(values)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.empty(int(lengths.sum()), dtype=values.dtype)
    width = values.dtype.itemsize
    raw = values.view(np.uint8)
    kernels.gather_bytes(np.array([raw.ctypes.data], np.uint64), [raw], np.zeros(len(lengths), np.int64),
                         np.asarray(starts, dtype=np.int64) * width, lengths * width, out.view(np.uint8))
    return out


@dataclass
class PackedUnits:
    """Every packed micro-batch's few numbers (each rank holds them all: bytes per micro-batch, not per sample).

    Each rank's micro-batches are its whole packing's, then its part passes' (``part`` true).
    """

    tokens: np.ndarray
    samples: np.ndarray
    padded: np.ndarray
    source: np.ndarray
    stage: np.ndarray
    part: np.ndarray
    firsts: np.ndarray  # packed micro-batch number where each rank's micro-batches start, plus the end
    targets: np.ndarray | None = None  # fine-tuning data: each micro-batch's loss targets

    def units(self, s: int, part: bool, group: int) -> np.ndarray:
        """Return source ``s``'s units (rows of ``group`` packed micro-batch numbers) of one packing, in pack order."""
        return np.flatnonzero((self.source == s) & (self.part == part)).reshape(-1, group)


def gather_packed(comm: Comm, mbs: Microbatches, stages: int, parts: int = 0) -> PackedUnits:
    """Return every rank's packed micro-batches' numbers (the last ``parts`` of each rank's are part-pass ones)."""
    c = mbs.columns
    code = c["stage"].astype(np.int64)
    padded = c["batch_size"].astype(np.int64) * c["padded_size"].astype(np.int64)
    m = len(c["tokens"])
    firsts = np.array([0] + [int(x) for x in np.cumsum(comm.allgather_obj(m))], dtype=np.int64)
    code_all = comm.allgatherv(code)
    part = comm.allgatherv((np.arange(m) >= m - parts).astype(np.uint8)).astype(bool)
    targets = comm.allgatherv(c["targets"].astype(np.int64)) if "targets" in c else None
    return PackedUnits(comm.allgatherv(c["tokens"].astype(np.int64)),
                       comm.allgatherv(c["num_samples"].astype(np.int64)),
                       comm.allgatherv(padded), code_all // stages, code_all % stages, part, firsts, targets)


def held_tokens(packed: PackedUnits, names: list[str], group: int) -> np.ndarray:
    """Return each source's tokens in its whole packing, refusing a source that packed to nothing."""
    held = np.zeros(len(names), dtype=np.int64)
    for s in range(len(names)):
        mine = (packed.source == s) & ~packed.part
        if not mine.any():
            raise SortpackError(f"mixture source {names[s]!r}: no micro-batches (every sample skipped)",
                                collective=True)
        if int(mine.sum()) % group:
            raise RuntimeError("same-shape groups straddle a mixture source")
        held[s] = int(packed.tokens[mine].sum())
    return held


def concat_microbatches(a: Microbatches, b: Microbatches) -> Microbatches:
    """Return this rank's micro-batches of ``a`` then ``b`` as one (numbering: the caller's)."""
    rows = None if a.row_sizes is None or b.row_sizes is None else np.concatenate((a.row_sizes, b.row_sizes))
    begin = end = None
    if a.begin is not None and b.begin is not None and a.end is not None and b.end is not None:
        # --oversize split: the pieces' ranges, parallel to the sample ids
        begin, end = np.concatenate((a.begin, b.begin)), np.concatenate((a.end, b.end))
    return Microbatches(a.first, a.total + b.total, np.concatenate((a.sample_ids, b.sample_ids)),
                        np.concatenate((a.offsets, a.offsets[-1] + b.offsets[1:])),
                        {name: np.concatenate((col, b.columns[name])) for name, col in a.columns.items()},
                        a.stats, rows, begin, end, shapes=a.shapes)


def choose_part_passes(comm: Comm, ordered: SampleColumns, mbs: Microbatches, popts: PackOptions, mix: Mixture,
                       group: int, stages: int) -> tuple[PackedUnits, SampleColumns | None]:
    """Return (every rank's units of the whole packing ``mbs``, the part passes' samples or None).

    The part passes are the sources' uses past their whole passes: a seeded subset of samples
    of the sorted union ``ordered`` (``part_pass.part_pass_samples``). Collective.
    """
    packed = gather_packed(comm, mbs, stages)
    holds = held_tokens(packed, list(mix.names), group)
    needs = pass_needs(holds, mix.schedule, mix.total_tokens)
    return packed, part_pass_samples(comm, ordered, popts, needs.part, holds, mix.seed, stages)


def pack_part_passes(comm: Comm, chosen: SampleColumns | None, mbs: Microbatches, packed: PackedUnits,
                     popts: PackOptions, stages: int, key: str) -> tuple[Microbatches, PackedUnits]:
    """Return (the whole packing then the part passes' micro-batches, every rank's units of both). Collective.

    The part passes' samples ``chosen`` are packed on their own with the lengths the whole
    packing used (``--shapes auto:K`` chooses them once, from the whole packing).
    """
    if chosen is None:
        return mbs, packed
    part_mbs = pack_samples(comm, chosen, dataclasses.replace(popts.with_shapes(mbs.shapes), auto_shapes=None), key)
    n_part = len(part_mbs.columns["tokens"])
    mbs = concat_microbatches(mbs, part_mbs)
    return mbs, gather_packed(comm, mbs, stages, n_part)


def split_source(mbs: Microbatches, stages: int) -> Microbatches:
    """Return ``mbs`` with its ``source`` and ``stage`` columns split from the sort's code (source * stages + stage)."""
    code = mbs.columns["stage"].astype(np.int64)
    mbs.columns["source"] = (code // stages).astype(np.int16)
    mbs.columns["stage"] = (code % stages).astype(np.int16)
    return mbs


# --- the blend -----------------------------------------------------------------------------

def blend_units(packed: PackedUnits, mix: Mixture, group: int) -> tuple[Blend, np.ndarray]:
    """Return (the blend of units, each plan micro-batch's packed number)."""
    k = len(mix.sources)
    tokens, stages, samples, parts, tables = [], [], [], [], []
    for s in range(k):
        whole, part = packed.units(s, False, group), packed.units(s, True, group)
        tokens.append(packed.tokens[whole].sum(axis=1))
        stages.append(packed.stage[whole[:, 0]])
        samples.append(packed.samples[whole].sum(axis=1))
        parts.append((packed.tokens[part].sum(axis=1), packed.stage[part[:, 0]], packed.samples[part].sum(axis=1))
                     if len(part) else None)
        tables.append(np.concatenate((whole, part)))
    blend = plan_blend(tokens, stages, mix.schedule, mix.total_tokens, mix.seed, mix.names, samples, parts)
    first = np.concatenate(([0], np.cumsum([len(t) for t in tables])))
    table = np.concatenate(tables)
    g = table[first[blend.source.astype(np.int64)] + blend.unit]
    return blend, g.reshape(-1)


def move_plan(g: np.ndarray, first: int, m: int, writers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (the plan numbers this rank sends, the rank each goes to, its local micro-batch) (pure).

    Plan micro-batch i is packed micro-batch ``g[i]``; this rank packed ``[first, first + m)``;
    ``writers[r]`` is the first plan micro-batch rank r writes (plus the end). A repeated
    micro-batch is sent once per use.
    """
    sel = np.flatnonzero((g >= first) & (g < first + m))
    dest = np.searchsorted(writers, sel, side="right") - 1
    return sel, dest, g[sel] - first


def plan_order(plan: np.ndarray, cols: dict, ids: np.ndarray, rows: np.ndarray | None,
               ranges: tuple[np.ndarray, ...] | None = None
               ) -> tuple[dict, np.ndarray, np.ndarray | None, tuple[np.ndarray, ...] | None]:
    """Return received micro-batches (columns, sample ids, row sizes, piece ranges) sorted by their plan number
    ``plan`` (pure). ``ranges`` (``--oversize split``: begin, end) are parallel to ``ids``."""
    if len(plan) < 2 or bool(np.all(plan[1:] > plan[:-1])):
        return cols, ids, rows, ranges  # one sender (P=1): already in plan order
    order = np.argsort(plan, kind="stable")
    ns = cols["num_samples"].astype(np.int64)
    at = np.concatenate(([0], np.cumsum(ns)))[:-1]
    ids = take_runs(ids, at[order], ns[order])
    if ranges is not None:
        ranges = tuple(take_runs(r, at[order], ns[order]) for r in ranges)
    if rows is not None:
        nrows = cols["batch_size"].astype(np.int64)
        rat = np.concatenate(([0], np.cumsum(nrows)))[:-1]
        rows = take_runs(rows, rat[order], nrows[order])
    return {name: col[order] for name, col in cols.items()}, ids, rows, ranges


def move_to_writers(comm: Comm, mbs: Microbatches, packed: PackedUnits, g: np.ndarray, rows_per_shard: int,
                    samples_per_shard: int
                    ) -> tuple[int, dict, np.ndarray, np.ndarray | None, tuple[np.ndarray, ...] | None]:
    """Return this rank's block of plan micro-batches: (first, columns, sample ids, row sizes or None, piece
    ranges (begin, end) or None).

    Plan micro-batch i is packed micro-batch ``g[i]``; each rank gets the block of the plan
    whose index shards it writes (``write_index`` then moves nothing). One Alltoallv of the
    per-micro-batch columns and one of the sample ids (with ``--oversize split``: one more per
    piece range, moved as the ids are).
    """
    ns = packed.samples[g]
    lo = balanced_blocks(ns.astype(np.float64) + 1.0, comm.size)
    # the shard layout depends on the plan's sample counts only, not on how they are dealt
    r = comm.rank
    _, lo = index_shard_layout(comm, ns[lo[r]:lo[r + 1]], int(lo[r]), len(g), rows_per_shard, samples_per_shard)
    sel, dest, loc = move_plan(g, int(packed.firsts[r]), len(mbs.offsets) - 1, lo)
    per_mb = {name: col[loc] for name, col in mbs.columns.items()}
    per_mb["plan"] = sel
    got = comm.alltoallv_many(per_mb, np.bincount(dest, minlength=comm.size))
    lens = mbs.columns["num_samples"].astype(np.int64)[loc]
    id_counts = np.bincount(dest, weights=lens, minlength=comm.size).astype(np.int64)
    ids = comm.alltoallv(take_runs(mbs.sample_ids, mbs.offsets[:-1][loc], lens), id_counts)
    ranges = None
    if mbs.begin is not None and mbs.end is not None:
        ranges = tuple(comm.alltoallv(take_runs(r, mbs.offsets[:-1][loc], lens), id_counts)
                       for r in (mbs.begin, mbs.end))
    rows = None
    if mbs.row_sizes is not None:
        nrows = mbs.columns["batch_size"].astype(np.int64)
        row_off = np.concatenate(([0], np.cumsum(nrows)))
        rows = comm.alltoallv(take_runs(mbs.row_sizes, row_off[:-1][loc], nrows[loc]),
                              np.bincount(dest, weights=nrows[loc], minlength=comm.size).astype(np.int64))
    cols, ids, rows, ranges = plan_order(got.pop("plan"), got, ids, rows, ranges)
    return int(lo[r]), cols, ids, rows, ranges


def _fewest_uses(packed: PackedUnits, whole: np.ndarray, part: np.ndarray, whole_uses: np.ndarray,
                 part_uses: np.ndarray, samples_held: int) -> int:
    """Return the fewest uses of any sample of a source (its ``whole_passes``).

    A sample is used by its whole packing's micro-batch and, when the part pass chose it, once
    more by the part pass's. Where the used part-pass micro-batches hold every sample of the
    source (a part pass that took them all), each sample has that use too: its one pass is a
    part pass, and counting whole-packing uses alone said 0.
    """
    fewest = int(whole_uses.min()) if len(whole_uses) else 0
    if len(part) and int(part_uses.min()) > 0 and int(packed.samples[part].sum()) == samples_held:
        fewest += int(part_uses.min())
    return fewest


def _source_record(s: int, mix: Mixture, blend: Blend, packed: PackedUnits, g: np.ndarray, group: int) -> dict:
    """Return what source ``s`` holds and gives in the plan (its part of the ``mixture`` record)."""
    src = packed.source[g]
    whole = packed.units(s, False, group).reshape(-1)
    part = packed.units(s, True, group).reshape(-1)
    mine = src == s
    used = g[mine]
    uses = np.bincount(g, minlength=len(packed.tokens))
    whole_uses, part_uses = uses[whole], uses[part]
    held = int(packed.tokens[whole].sum())
    got = int(packed.tokens[g][mine].sum())
    padded = int(packed.padded[used].sum())
    samples_held = int(packed.samples[whole].sum())
    if whole_uses.min() > 0:
        unique = samples_held
    else:  # no whole pass completed: the part pass, after them, gave nothing, or it is the only pass
        unique = int(packed.samples[whole][whole_uses > 0].sum()) + int(packed.samples[part][part_uses > 0].sum())
    passes = np.repeat(blend.passes, group)
    # fine-tuning data: the loss targets the source holds and gives (recorded only for such plans)
    targets = {} if packed.targets is None else {"targets_held": int(packed.targets[whole].sum()),
                                                 "targets": int(packed.targets[g][mine].sum())}
    return {
        **targets,
        "tokens_held": held, "samples_held": samples_held, "microbatches_held": len(whole),
        "tokens": got, "samples": int(packed.samples[used].sum()), "microbatches": int(mine.sum()),
        "unique_samples": unique,
        "passes": got / held, "whole_passes": _fewest_uses(packed, whole, part, whole_uses, part_uses, samples_held),
        "most_uses": int(whole_uses.max()) + int(part_uses.sum() > 0),
        "pass_count": int(passes[mine].max()) + 1 if mine.any() else 0,
        "part_pass": {"samples": int(packed.samples[part].sum()), "tokens": int(packed.tokens[part].sum()),
                      "microbatches": len(part)},
        "padding_ratio": (1.0 - got / padded) if padded else 0.0,
    }


def mixture_record(mix: Mixture, blend: Blend, packed: PackedUnits, g: np.ndarray, bases: np.ndarray,
                   file_counts: list[int], group: int) -> dict:
    """Return the manifest's ``mixture`` object: the spec, what each source gives, and the prefix bound."""
    tokens = packed.tokens[g]
    dev = deviations(tokens, packed.source[g], mix.schedule, blend.total)
    file_first = np.concatenate(([0], np.cumsum(file_counts)))
    sources = []
    for s, spec in enumerate(mix.sources):
        figures = _source_record(s, mix, blend, packed, g, group)
        sources.append({
            "name": spec.name, "inputs": list(spec.inputs), "column": spec.column, "weight": spec.weight,
            "first_sample": int(bases[s]), "num_rows": int(bases[s + 1] - bases[s]),
            "files": [int(file_first[s]), int(file_counts[s])],
            "share": float(mix.schedule.shares()[s]),
            **figures,
            "max_deviation_tokens": float(dev[s]),
        })
    return {
        **mix.as_dict(),
        "target_tokens": blend.total,
        "tokens": int(tokens.sum()),
        "unit": "microbatch" if group == 1 else f"group of {group} micro-batches",
        "interleave": "wf2q",
        "bound_tokens": int(blend.bound),
        "max_deviation_tokens": float(dev.max()),
        "sources": sources,
    }


# what the packing counted that the plan's stats keep (the rest is recounted from the plan's micro-batches)
_KEPT_STATS = ("oversize", "skipped", "truncated", "skipped_tokens", "truncated_tokens", "auto_shapes", "split",
               "split_pieces", "split_tokens")


def blend_mixture(comm: Comm, mbs: Microbatches, packed: PackedUnits, mix: Mixture, group: int, stages: int,
                  bases: np.ndarray, file_counts: list[int], rows_per_shard: int,
                  samples_per_shard: int) -> tuple[Microbatches, dict]:
    """Return (this rank's block of the plan's micro-batches, the manifest's ``mixture`` record). Collective.

    ``mbs`` are this rank's packed micro-batches (whole packing, then part passes) and
    ``packed`` every rank's units; the plan's block is the one this rank writes.
    """
    blend, g = blend_units(packed, mix, group)
    mbs = split_source(mbs, stages)
    start, cols, ids, rows, ranges = move_to_writers(comm, mbs, packed, g, rows_per_shard, samples_per_shard)
    record = mixture_record(mix, blend, packed, g, bases, file_counts, group)
    info = {key: mbs.stats[key] for key in _KEPT_STATS if key in mbs.stats}
    if mbs.stats.get("empty"):
        # the sources' empty samples that packing dropped (or kept): recorded only when there are
        # some, so the other mixture plans keep their hash
        info.update({key: mbs.stats[key] for key in ("empty", "empty_dropped")})
    begin, end = ranges if ranges is not None else (None, None)
    plan = Microbatches(start, len(g), ids, np.concatenate(([0], np.cumsum(cols["num_samples"], dtype=np.int64))),
                        cols, microbatch_stats(comm, cols, info), rows, begin, end, shapes=mbs.shapes)
    return plan, record
