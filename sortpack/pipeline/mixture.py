"""``sortpack run --mixture``: one plan over several weighted sources, following a schedule.

The job (collective, like ``pipeline.run_all``):

1. analyze each source with the run's SPECs (its own ``column`` when it names one); sample ids
   are global row numbers: the sources in order, each source's files in order;
2. ONE distributed sort of the union by (source, key, sample id): the source is the top bits
   of the sort key, so curriculum stages are quantiles within each source. Each rank's rows
   are numbered contiguously for the sort (so it keeps its packed-key fast path) and mapped
   back to global ids after it;
3. pack, with pieces cut where the source (or stage) changes: a micro-batch never mixes
   sources, and every packing option applies within each source;
4. part passes (``part_pass.part_pass_samples``): the sources' needs past their whole passes,
   each a seeded subset of its sorted samples, packed on their own;
5. blend (``blend.plan_blend``): every rank gathers the per-micro-batch token counts (a few
   bytes per micro-batch, never per sample) and computes the same plan order;
6. move each plan micro-batch's sample ids from the rank that packed it to the rank that
   writes its index shard (one Alltoallv; a repeated micro-batch is sent once per use) and
   write the index with its ``source`` column and the manifest's ``mixture`` object.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import kernels
from ..errors import SortpackError
from ..format.kinds import rows_per_shard, samples_per_shard
from ..inputs.columns import check_columns, first_columns, input_columns, reads_text, resolve_column
from ..inputs.mixture import Mixture
from ..inputs.renames import source_renames
from ..inputs.schedule import deviations
from ..parallel import Comm
from ..partition import balanced_blocks, index_shard_layout
from ..stages.analyze import AnalyzeOptions, analyze
from ..stages.blend import Blend, pass_needs, plan_blend
from ..stages.holdout import DEFAULT_SEED, Holdout, split_holdout
from ..stages.pack import Microbatches, PackOptions, microbatch_stats, pack_samples
from ..stages.part_pass import part_pass_samples
from ..stages.samples import SampleColumns
from ..stages.sort import SortOptions, sort_samples
from ..stages.split import check_split
from ..write.index_writer import write_index
from ..write.output import OutputDir
from ..write.provenance import JobInfo, Profile
from ..write.store import StoreOptions, prepare
from .dataset import HoldoutRequest, write_holdout

__all__ = ["run_mixture"]


def _analyze_source(comm: Comm, mix: Mixture, k: int, aopts: AnalyzeOptions, progress: bool,
                    sink=None) -> SampleColumns:
    """Return this rank's slice of source ``k``'s samples (ids counted within the source)."""
    src = mix.sources[k]
    opts = dataclasses.replace(aopts, column=src.column or aopts.column)
    try:
        return analyze(comm, src.inputs, opts, progress, keep_tokens=sink)
    except SortpackError as exc:
        raise SortpackError(f"mixture source {src.name!r}: {exc}", collective=exc.collective) from None


def _analyze_together(comm: Comm, mix: Mixture, aopts: AnalyzeOptions,
                      progress: bool, sink=None) -> tuple[SampleColumns, np.ndarray, list[int]]:
    """Return (the union analyzed as one input, the sources' first global ids plus the end, files per source).

    When every source reads the same column, one analyze of the sources' inputs in order is the
    union's analyze: each rank's rows are contiguous global ids, as for any plan.
    """
    from ..inputs.discover import expand_inputs

    def count():
        return [len(expand_inputs(src.inputs, aopts.input_format, aopts.split)) for src in mix.sources]

    counts = comm.bcast_obj(comm.collectively(lambda: count() if comm.is_root() else None))
    opts = dataclasses.replace(aopts, column=mix.sources[0].column or aopts.column)
    try:
        samples = analyze(comm, [p for src in mix.sources for p in src.inputs], opts, progress, keep_tokens=sink)
    except SortpackError as exc:
        if exc.collective:  # every rank is here: find the source at fault, to name it
            for k in range(len(mix.sources)):
                _analyze_source(comm, mix, k, aopts, False)
        raise
    file_first = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    file_rows = np.array([int(f["rows"]) for f in samples.files], dtype=np.int64)
    rows = np.array([file_rows[file_first[k]:file_first[k + 1]].sum() for k in range(len(counts))], np.int64)
    empty = np.flatnonzero(rows == 0)
    if len(empty):
        raise SortpackError(f"mixture source {mix.sources[int(empty[0])].name!r}: its inputs hold no rows",
                            collective=True)
    return samples, np.concatenate(([0], np.cumsum(rows))), counts


def _plan_column(comm: Comm, mix: Mixture, aopts: AnalyzeOptions,
                 store: StoreOptions | None) -> tuple[str | None, list[int] | None]:
    """Return (the plan's column, each source's file count or None), refusing a missing column before analyze.

    The plan's column is ``--column``; else, when a source names its own ``column``, the column
    the other sources read (as analyze resolves it), else the first source's ``column``. Every
    source's column (where read) and every ``--store`` column (a source's own column for the
    plan's) must be in each of its files: one line naming the source, file and column.
    """
    storing = store is not None and store.enabled
    store_columns = list(store.columns) if store is not None and storing else []
    text = reads_text(aopts.size, aopts.difficulty, storing and bool(store and store.tokens))
    named = [src.column for src in mix.sources]
    if not (any(named) or store_columns or (aopts.column and text)):
        return aopts.column, None
    files = input_columns(comm, [src.inputs for src in mix.sources], aopts.input_format, aopts.split)
    plan = aopts.column
    if plan is None and any(named):
        plain = [f for src, fs in zip(mix.sources, files) if not src.column for f in fs]
        plan = resolve_column(first_columns(plain)) or next(c for c in named if c)
    for src, fs in zip(mix.sources, files):
        own = src.column or plan
        wanted = [(src.column, "its 'column'")] if src.column else []
        if own and text and not src.column:
            wanted.append((own, "--column" if aopts.column else "the text column"))
        wanted += [(own if c == plan and own else c, f"--store {c}") for c in store_columns]
        check_columns(fs, wanted, f"mixture source {src.name!r}: ")
    return plan, [len(fs) for fs in files]


def _groups(samples: SampleColumns, bases: np.ndarray) -> np.ndarray:
    """Return the source of each of this rank's contiguous samples (int16)."""
    n = len(samples)
    cuts = np.clip(bases - samples.start, 0, n)
    return np.repeat(np.arange(len(bases) - 1, dtype=np.int16), np.diff(cuts))


def _union(comm: Comm, parts: list[SampleColumns]
           ) -> tuple[SampleColumns, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
    """Return (the union numbered contiguously per rank, its groups, the segment table, source bases, files).

    The segment table (rows: contiguous start, global id start, count) maps the contiguous
    numbering back to global ids; ``bases[k]`` is source k's first global id.
    """
    rows = np.array([p.total for p in parts], dtype=np.int64)
    bases = np.concatenate(([0], np.cumsum(rows)))
    n = [len(p) for p in parts]
    mine = int(sum(n))
    vstart = comm.exscan(mine)
    local = np.concatenate(([0], np.cumsum(n)))[:-1] + vstart
    segs = [(int(local[k]), int(bases[k] + p.start), int(n[k])) for k, p in enumerate(parts) if n[k]]
    table = np.array([s for part in comm.allgather_obj(segs) for s in part] or [(0, 0, 0)], dtype=np.int64)
    table = table[np.argsort(table[:, 0], kind="stable")]
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
                          files, max((p.empty_size for p in parts), default=0))
    return union, groups, table, bases, files


def _global_ids(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Return the global ids of contiguous-numbering ids (``_union``'s table), in place."""
    seg = np.searchsorted(table[:, 0], ids, side="right") - 1
    ids += (table[:, 1] - table[:, 0])[seg]
    return ids


def _take_runs(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Return ``values[starts[i] : starts[i] + lengths[i]]`` of every i, concatenated (one memcpy per run)."""
    values = np.ascontiguousarray(values)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.empty(int(lengths.sum()), dtype=values.dtype)
    width = values.dtype.itemsize
    raw = values.view(np.uint8)
    kernels.gather_bytes(np.array([raw.ctypes.data], np.uint64), [raw], np.zeros(len(lengths), np.int64),
                         np.asarray(starts, dtype=np.int64) * width, lengths * width, out.view(np.uint8))
    return out


@dataclasses.dataclass
class _Packed:
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

    def units(self, s: int, part: bool, group: int) -> np.ndarray:
        """Return source ``s``'s units (rows of ``group`` packed micro-batch numbers) of one packing, in pack order."""
        return np.flatnonzero((self.source == s) & (self.part == part)).reshape(-1, group)


def _gather_packed(comm: Comm, mbs: Microbatches, stages: int, parts: int = 0) -> _Packed:
    """Return every rank's packed micro-batches' numbers (the last ``parts`` of each rank's are part-pass ones)."""
    c = mbs.columns
    code = c["stage"].astype(np.int64)
    padded = c["batch_size"].astype(np.int64) * c["padded_size"].astype(np.int64)
    m = len(c["tokens"])
    firsts = np.array([0] + [int(x) for x in np.cumsum(comm.allgather_obj(m))], dtype=np.int64)
    code_all = comm.allgatherv(code)
    part = comm.allgatherv((np.arange(m) >= m - parts).astype(np.uint8)).astype(bool)
    return _Packed(comm.allgatherv(c["tokens"].astype(np.int64)), comm.allgatherv(c["num_samples"].astype(np.int64)),
                   comm.allgatherv(padded), code_all // stages, code_all % stages, part, firsts)


def _held(packed: _Packed, mix: Mixture, group: int) -> np.ndarray:
    """Return each source's tokens in its whole packing, refusing a source that packed to nothing."""
    held = np.zeros(len(mix.sources), dtype=np.int64)
    for s in range(len(mix.sources)):
        mine = (packed.source == s) & ~packed.part
        if not mine.any():
            raise SortpackError(f"mixture source {mix.sources[s].name!r}: no micro-batches (every sample skipped)",
                                collective=True)
        if int(mine.sum()) % group:
            raise RuntimeError("same-shape groups straddle a mixture source")
        held[s] = int(packed.tokens[mine].sum())
    return held


def _blend(packed: _Packed, mix: Mixture, group: int) -> tuple[Blend, np.ndarray]:
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


def _concat(a: Microbatches, b: Microbatches) -> Microbatches:
    """Return this rank's micro-batches of ``a`` then ``b`` as one (numbering: the caller's)."""
    rows = None if a.row_sizes is None or b.row_sizes is None else np.concatenate((a.row_sizes, b.row_sizes))
    return Microbatches(a.first, a.total + b.total, np.concatenate((a.sample_ids, b.sample_ids)),
                        np.concatenate((a.offsets, a.offsets[-1] + b.offsets[1:])),
                        {name: np.concatenate((col, b.columns[name])) for name, col in a.columns.items()},
                        a.stats, rows)


def _move(comm: Comm, mbs: Microbatches, packed: _Packed, g: np.ndarray) -> tuple[int, dict, np.ndarray,
                                                                               np.ndarray | None]:
    """Return this rank's block of plan micro-batches: (first, columns, sample ids, row sizes or None).

    Plan micro-batch i is packed micro-batch ``g[i]``; each rank gets the block of the plan
    whose index shards it writes (``write_index`` then moves nothing). One Alltoallv of the
    per-micro-batch columns and one of the sample ids.
    """
    ns = packed.samples[g]
    lo = balanced_blocks(ns.astype(np.float64) + 1.0, comm.size)
    # the shard layout depends on the plan's sample counts only, not on how they are dealt
    r = comm.rank
    _, lo = index_shard_layout(comm, ns[lo[r]:lo[r + 1]], int(lo[r]), len(g), rows_per_shard("index"),
                               samples_per_shard())
    first = int(packed.firsts[comm.rank])
    m = len(mbs.offsets) - 1
    sel = np.flatnonzero((g >= first) & (g < first + m))
    dest = np.searchsorted(lo, sel, side="right") - 1
    loc = g[sel] - first
    per_mb = {name: col[loc] for name, col in mbs.columns.items()}
    per_mb["plan"] = sel
    got = comm.alltoallv_many(per_mb, np.bincount(dest, minlength=comm.size))
    ns = mbs.columns["num_samples"].astype(np.int64)
    lens = ns[loc]
    ids = comm.alltoallv(_take_runs(mbs.sample_ids, mbs.offsets[:-1][loc], lens),
                         np.bincount(dest, weights=lens, minlength=comm.size).astype(np.int64))
    rows = None
    if mbs.row_sizes is not None:
        nrows = mbs.columns["batch_size"].astype(np.int64)
        row_off = np.concatenate(([0], np.cumsum(nrows)))
        rows = comm.alltoallv(_take_runs(mbs.row_sizes, row_off[:-1][loc], nrows[loc]),
                              np.bincount(dest, weights=nrows[loc], minlength=comm.size).astype(np.int64))
    plan = got.pop("plan")
    if len(plan) < 2 or bool(np.all(plan[1:] > plan[:-1])):
        return int(lo[comm.rank]), got, ids, rows  # one sender (P=1): already in plan order
    order = np.argsort(plan, kind="stable")
    cols = {name: col[order] for name, col in got.items()}
    got_ns = got["num_samples"].astype(np.int64)
    at = np.concatenate(([0], np.cumsum(got_ns)))[:-1]
    ids = _take_runs(ids, at[order], got_ns[order])
    if rows is not None:
        got_rows = got["batch_size"].astype(np.int64)
        rat = np.concatenate(([0], np.cumsum(got_rows)))[:-1]
        rows = _take_runs(rows, rat[order], got_rows[order])
    return int(lo[comm.rank]), cols, ids, rows


def _record(mix: Mixture, blend: Blend, packed: _Packed, g: np.ndarray, bases: np.ndarray,
            file_counts: list[int], group: int) -> dict:
    """Return the manifest's ``mixture`` object: the spec, what each source gives, and the prefix bound."""
    src = packed.source[g]
    tokens = packed.tokens[g]
    dev = deviations(tokens, src, mix.schedule, blend.total)
    file_first = np.concatenate(([0], np.cumsum(file_counts)))
    sources = []
    passes = np.repeat(blend.passes, group)
    uses = np.bincount(g, minlength=len(packed.tokens))
    for s, spec in enumerate(mix.sources):
        whole = packed.units(s, False, group).reshape(-1)
        part = packed.units(s, True, group).reshape(-1)
        mine = src == s
        used = g[mine]
        whole_uses, part_uses = uses[whole], uses[part]
        held = int(packed.tokens[whole].sum())
        got = int(tokens[mine].sum())
        padded = int(packed.padded[used].sum())
        samples_held = int(packed.samples[whole].sum())
        if whole_uses.min() > 0:
            unique = samples_held
        else:  # no whole pass completed: the part pass, after them, gave nothing, or it is the only pass
            unique = int(packed.samples[whole][whole_uses > 0].sum()) + int(packed.samples[part][part_uses > 0].sum())
        sources.append({
            "name": spec.name, "inputs": list(spec.inputs), "column": spec.column, "weight": spec.weight,
            "first_sample": int(bases[s]), "num_rows": int(bases[s + 1] - bases[s]),
            "files": [int(file_first[s]), int(file_counts[s])],
            "share": float(mix.schedule.shares()[s]),
            "tokens_held": held, "samples_held": samples_held, "microbatches_held": len(whole),
            "tokens": got, "samples": int(packed.samples[used].sum()), "microbatches": int(mine.sum()),
            "unique_samples": unique,
            "passes": got / held, "whole_passes": int(whole_uses.min()),
            "most_uses": int(whole_uses.max()) + int(part_uses.sum() > 0),
            "pass_count": int(passes[mine].max()) + 1 if mine.any() else 0,
            "part_pass": {"samples": int(packed.samples[part].sum()), "tokens": int(packed.tokens[part].sum()),
                          "microbatches": len(part)},
            "padding_ratio": (1.0 - got / padded) if padded else 0.0,
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


def _holdout_plan(mix: Mixture, request: HoldoutRequest | None, bases: np.ndarray) -> Holdout | None:
    """Return what each source holds out: its own ``holdout``, else --holdout's (None: nothing anywhere)."""
    default = request.value if request is not None else None
    requests = [src.holdout if src.holdout is not None else default for src in mix.sources]
    seed = request.seed if request is not None and request.seed is not None else mix.holdout_seed
    return Holdout.plan(requests, bases, list(mix.names), DEFAULT_SEED if seed is None else seed,
                        what="--holdout" if any(src.holdout is None for src in mix.sources) else "holdout")


def _by_source(mbs: Microbatches, stages: int) -> Microbatches:
    """Return a held-out mixture plan's micro-batches with ``source`` and ``stage`` split from the sort's code."""
    code = mbs.columns["stage"].astype(np.int64)
    mbs.columns["source"] = (code // stages).astype(np.int16)
    mbs.columns["stage"] = (code % stages).astype(np.int16)
    return mbs


def run_mixture(comm: Comm, mix: Mixture, output: str, aopts: AnalyzeOptions, sopts: SortOptions,
                popts: PackOptions, overwrite: bool, job: JobInfo, progress: bool = False,
                store: StoreOptions | None = None, holdout: HoldoutRequest | None = None) -> dict | None:
    """Plan a mixture in one job (analyze, one sort, pack, blend) and write its index; the manifest on rank 0.

    ``holdout`` (--holdout, --holdout-seed) and the sources' own ``holdout`` say what each source
    sets aside: those samples leave the plan before packing and form the held-out plan in
    ``OUTPUT/holdout`` (every held-out sample once, micro-batches by source, no blend).
    """
    comm.collectively(sopts.validate)
    comm.collectively(popts.validate)
    if popts.oversize == "split":
        comm.collectively(check_split, aopts.as_dict(), mixture=True)
    k = len(mix.sources)
    if k * sopts.stages > np.iinfo(np.int16).max:
        raise SortpackError(f"--stages {sopts.stages} with {k} mixture sources: at most "
                            f"{np.iinfo(np.int16).max // k} stages", collective=True)  # every rank, after collectives
    plan_column, file_counts = _plan_column(comm, mix, aopts, store)
    if plan_column != aopts.column:  # a source's own column is read under the plan's name
        aopts = dataclasses.replace(aopts, column=plan_column)
    store_fn = None
    if store is not None and store.enabled:
        renames = None
        if file_counts is not None:
            renames = source_renames(plan_column, [src.column for src in mix.sources], file_counts)
        store_fn = prepare(comm, store, aopts.as_dict(), popts, aopts.tokenizer, renames)
    out = OutputDir(comm, output, overwrite)
    prof = Profile(comm)
    group = popts.group_size if popts.same_shape else 1

    def work():
        table = None
        sink = store_fn.token_cache(out) if store_fn is not None else None  # ids kept, not re-tokenized
        with prof.stage("analyze"):
            if len({src.column or aopts.column for src in mix.sources}) == 1:
                union, bases, file_counts = _analyze_together(comm, mix, aopts, progress, sink)
                groups = _groups(union, bases)
                files = union.files
            else:  # each source its own column: analyzed apart, numbered contiguously for the sort
                parts = [_analyze_source(comm, mix, s, aopts, progress, sink) for s in range(k)]
                file_counts = [len(p.files) for p in parts]
                if sink is not None:  # this rank's ids are a run of rows per source
                    firsts = np.concatenate(([0], np.cumsum([p.total for p in parts])))
                    sink.set_runs([(int(firsts[s]) + p.start, len(p)) for s, p in enumerate(parts)])
                union, groups, table, bases, files = _union(comm, parts)
                del parts
        prof.counts["analyze_rows"] = len(union)
        hplan = comm.collectively(_holdout_plan, mix, holdout, bases)  # a bad count fails before the sort
        with prof.stage("sort"):
            # by (source, key, id); the stage comes back as source * stages + stage, so the
            # pieces of packing end where the source (or the stage) changes
            ordered = sort_samples(comm, union, sopts, rows_per_shard("sorted"), consume=True, groups=groups)
            del union, groups
            if table is not None:
                _global_ids(table, ordered.sample_id)
        held = None
        if hplan is not None:
            # by global sample id, before packing drops, skips or cuts anything (docs/mixtures.md)
            with prof.stage("holdout_choice"):
                ordered, held = split_holdout(comm, ordered, hplan)
        with prof.stage("pack"):
            mbs = pack_samples(comm, ordered, popts, sopts.key)
        with prof.stage("part_pass"):
            # the uses past the whole passes: a seeded subset of samples, packed on its own
            packed = _gather_packed(comm, mbs, sopts.stages)
            holds = _held(packed, mix, group)
            needs = pass_needs(holds, mix.schedule, mix.total_tokens)
            chosen = part_pass_samples(comm, ordered, popts, needs.part, holds, mix.seed, sopts.stages)
            del ordered
            if chosen is not None:
                # the lengths the whole packing chose (--shapes auto:K) hold for the part passes too
                part_mbs = pack_samples(comm, chosen, dataclasses.replace(popts, auto_shapes=None), sopts.key)
                del chosen
                n_part = len(part_mbs.columns["tokens"])
                mbs = _concat(mbs, part_mbs)
                packed = _gather_packed(comm, mbs, sopts.stages, n_part)
        with prof.stage("blend"):
            blend, g = _blend(packed, mix, group)
            code = mbs.columns["stage"].astype(np.int64)
            mbs.columns["source"] = (code // sopts.stages).astype(np.int16)
            mbs.columns["stage"] = (code % sopts.stages).astype(np.int16)
            start, cols, ids, rows = _move(comm, mbs, packed, g)
            record = _record(mix, blend, packed, g, bases, file_counts, group)
        info = {key: mbs.stats[key] for key in ("oversize", "skipped", "truncated", "auto_shapes") if key in mbs.stats}
        plan = Microbatches(start, len(g), ids, np.concatenate(([0], np.cumsum(cols["num_samples"], dtype=np.int64))),
                            cols, microbatch_stats(comm, cols, info), rows)
        del mbs
        options = {**aopts.as_dict(), **sopts.as_dict(), **popts.as_dict()}
        extra = {"mixture": record}
        if hplan is not None and held is not None:
            if store_fn is not None:
                store_fn.also_holdout()
            with prof.stage("holdout"):
                extra["holdout"] = write_holdout(comm, out, held, hplan, popts, sopts.key, options, files, job,
                                                 store_fn, to_plan=lambda m: _by_source(m, sopts.stages))
            del held
        return write_index(comm, out, plan, options, files, prof, job, store_fn, extra=extra)

    try:
        return work()
    except BaseException:
        out.discard()
        raise
