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

This module only orchestrates: the union, the part passes, the blend, the move and the
``mixture`` record are ``stages.mixture``'s; ``pipeline.job`` is the skeleton of the job.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import SortpackError
from ..format.kinds import rows_per_shard, samples_per_shard
from ..inputs.columns import check_columns, first_columns, input_columns, reads_text, resolve_column
from ..inputs.mixture import Mixture
from ..inputs.renames import source_renames
from ..parallel import Comm
from ..stages.analyze import AnalyzeOptions, Keepers, analyze
from ..stages.mixture import (
    blend_mixture,
    choose_part_passes,
    global_ids,
    holdout_plan,
    pack_part_passes,
    source_bases,
    source_of,
    split_source,
    split_union,
    union_sources,
)
from ..stages.pack import PackOptions, refuse_oversize
from ..stages.plan_options import PlanOptions
from ..stages.samples import SampleColumns
from ..stages.sort import SortOptions, sort_samples
from ..stages.split import SPLIT_KINDS, ByteCuts, byte_cuts
from ..write.index_writer import write_index
from ..write.plan_record import PlanRecord
from ..write.provenance import JobInfo
from ..write.store import Store, StoreOptions
from .dataset import HoldoutRequest, write_holdout
from .job import JobScope, check_options, hold_out_and_pack, job_scope, split_check, store_for

__all__ = ["run_mixture"]


def _analyze_source(comm: Comm, mix: Mixture, k: int, aopts: AnalyzeOptions, progress: bool,
                    sink=None) -> SampleColumns:
    """Return this rank's slice of source ``k``'s samples (ids counted within the source)."""
    src = mix.sources[k]
    opts = dataclasses.replace(aopts, column=src.column or aopts.column)
    try:
        return analyze(comm, src.inputs, opts, progress, Keepers(sink))
    except SortpackError as exc:
        raise SortpackError(f"mixture source {src.name!r}: {exc}", collective=exc.collective) from None


def _analyze_together(comm: Comm, mix: Mixture, aopts: AnalyzeOptions, progress: bool, sink=None,
                      cuts: ByteCuts | None = None) -> tuple[SampleColumns, np.ndarray, list[int]]:
    """Return (the union analyzed as one input, the sources' first global ids plus the end, files per source).

    When every source reads the same column, one analyze of the sources' inputs in order is the
    union's analyze: each rank's rows are contiguous global ids, as for any plan. ``cuts``
    (``--size bytes --oversize split``): where the oversize texts are cut, placed while read.
    """
    from ..inputs.discover import expand_inputs

    def count():
        return [len(expand_inputs(src.inputs, aopts.input_format, aopts.split)) for src in mix.sources]

    counts = comm.bcast_obj(comm.collectively(lambda: count() if comm.is_root() else None))
    opts = dataclasses.replace(aopts, column=mix.sources[0].column or aopts.column)
    try:
        samples = analyze(comm, [p for src in mix.sources for p in src.inputs], opts, progress, Keepers(sink, cuts))
    except SortpackError as exc:
        if exc.collective:  # every rank is here: find the source at fault, to name it
            for k in range(len(mix.sources)):
                _analyze_source(comm, mix, k, aopts, False)
        raise
    file_rows = np.array([int(f["rows"]) for f in samples.files], dtype=np.int64)
    return samples, source_bases(file_rows, counts, list(mix.names)), counts


def _plan_column(comm: Comm, mix: Mixture, aopts: AnalyzeOptions, store: StoreOptions | None,
                 splitting: bool = False) -> tuple[str | None, list[int] | None]:
    """Return (the plan's column, each source's file count or None), refusing a missing column before analyze.

    The plan's column is ``--column``; else, when a source names its own ``column``, the column
    the other sources read (as analyze resolves it), else the first source's ``column``. Every
    source's column (where read) and every ``--store`` column (a source's own column for the
    plan's) must be in each of its files: one line naming the source, file and column.
    ``splitting`` (``--oversize split``): the plan names the column it cuts even where analyze
    chose it (the store and the reader cut the column the options name).
    """
    storing = store is not None and store.enabled
    store_columns = list(store.columns) if store is not None and storing else []
    text = reads_text(aopts.size, aopts.difficulty, storing and bool(store and store.tokens))
    named = [src.column for src in mix.sources]
    if not (any(named) or store_columns or (aopts.column and text) or splitting):
        return aopts.column, None
    files = input_columns(comm, [src.inputs for src in mix.sources], aopts.input_format, aopts.split)
    plan = aopts.column
    if plan is None and (any(named) or splitting):
        plain = [f for src, fs in zip(mix.sources, files) if not src.column for f in fs]
        plan = resolve_column(first_columns(plain)) or next((c for c in named if c), None)
    for src, fs in zip(mix.sources, files):
        own = src.column or plan
        wanted = [(src.column, "its 'column'")] if src.column else []
        if own and text and not src.column:
            wanted.append((own, "--column" if aopts.column else "the text column"))
        wanted += [(own if c == plan and own else c, f"--store {c}") for c in store_columns]
        check_columns(fs, wanted, f"mixture source {src.name!r}: ")
    return plan, [len(fs) for fs in files]


def _analyze_union(comm: Comm, mix: Mixture, aopts: AnalyzeOptions, progress: bool, sink, cuts: ByteCuts | None
                   ) -> tuple[SampleColumns, np.ndarray, np.ndarray | None, np.ndarray, list[dict], list[int]]:
    """Return (this rank's union, its samples' sources, the segment table or None, source bases, files, file counts).

    Sources reading one column are analyzed as one input (``cuts``: the byte cuts placed while
    it reads); else each apart, numbered contiguously for the sort (the table maps the numbers
    back: ``stages.mixture.global_ids``); ``--size bytes --oversize split`` is refused then.
    """
    if _own_column(mix, aopts) is None:
        union, bases, file_counts = _analyze_together(comm, mix, aopts, progress, sink, cuts)
        return union, source_of(union, bases), None, bases, union.files, file_counts
    parts = [_analyze_source(comm, mix, s, aopts, progress, sink) for s in range(len(mix.sources))]
    file_counts = [len(p.files) for p in parts]
    if sink is not None:  # this rank's ids are a run of rows per source
        firsts = np.concatenate(([0], np.cumsum([p.total for p in parts])))
        sink.set_runs([(int(firsts[s]) + p.start, len(p)) for s, p in enumerate(parts)])
    union, groups, table, bases, files = union_sources(comm, parts)
    return union, groups, table, bases, files, file_counts


def _own_column(mix: Mixture, aopts: AnalyzeOptions) -> str | None:
    """Return the first source that reads a column other than the plan's, as ``"'name' reads 'column'"`` (or None)."""
    return next((f"{src.name!r} reads {src.column!r}" for src in mix.sources
                 if src.column and src.column != aopts.column), None)


def _check_stages(mix: Mixture, sopts: SortOptions) -> None:
    """Refuse more curriculum stages than the int16 code ``source * stages + stage`` holds (every rank)."""
    k = len(mix.sources)
    if k * sopts.stages > np.iinfo(np.int16).max:
        raise SortpackError(f"--stages {sopts.stages} with {k} mixture sources: at most "
                            f"{np.iinfo(np.int16).max // k} stages", collective=True)  # every rank, after collectives


def _plan_mixture(comm: Comm, scope: JobScope, mix: Mixture, aopts: AnalyzeOptions, sopts: SortOptions,
                  popts: PackOptions, job: JobInfo, progress: bool, store_fn: Store | None,
                  holdout: HoldoutRequest | None) -> dict | None:
    """Analyze, sort, hold out, pack, blend and write the mixture's index; return the manifest on rank 0."""
    out, prof = scope.out, scope.prof
    group = popts.group_size if popts.same_shape else 1
    sink = store_fn.token_cache(out) if store_fn is not None else None  # ids kept, not re-tokenized
    with prof.stage("analyze"):
        cuts = byte_cuts(aopts, popts)  # --size bytes --oversize split: cut while the text is read
        union, groups, table, bases, files, file_counts = _analyze_union(comm, mix, aopts, progress, sink, cuts)
    prof.counts["analyze_rows"] = len(union)
    refuse_oversize(comm, union, popts)  # fail fast: before the sort, as `run` does
    hplan = comm.collectively(holdout_plan, mix, holdout.value if holdout is not None else None,
                              holdout.seed if holdout is not None else None, bases)  # fails before the sort
    split = None
    if popts.oversize == "split":
        # before the sort, as `run` cuts: pieces are sorted by their own sizes, each in its source
        with prof.stage("split"):
            union, groups, split = split_union(comm, union, groups, table, bases, PlanOptions(aopts, sopts, popts),
                                               cuts, hplan)
    with prof.stage("sort"):
        # by (source, key, id); the stage comes back as source * stages + stage, so the
        # pieces of packing end where the source (or the stage) changes
        ordered = sort_samples(comm, union, sopts, rows_per_shard("sorted"), consume=True, groups=groups)
        del union, groups
        if table is not None:
            global_ids(table, ordered.sample_id)
    # by global sample id (docs/mixtures.md)
    ordered, held, mbs = hold_out_and_pack(comm, prof, ordered, hplan, popts, sopts.key, split)
    with prof.stage("part_pass"):
        # the uses past the whole passes: a seeded subset of samples, packed on its own
        packed, chosen = choose_part_passes(comm, ordered, mbs, popts, mix, group, sopts.stages)
        del ordered
        mbs, packed = pack_part_passes(comm, chosen, mbs, packed, popts, sopts.stages, sopts.key)
        del chosen
    with prof.stage("blend"):
        plan, record = blend_mixture(comm, mbs, packed, mix, group, sopts.stages, bases, file_counts,
                                     rows_per_shard("index"), samples_per_shard())
    del mbs
    options = PlanOptions(aopts, sopts, popts.with_shapes(plan.shapes))
    extra = {"mixture": record}
    if hplan is not None and held is not None:
        if store_fn is not None:
            store_fn.also_holdout()
        with prof.stage("holdout"):
            extra["holdout"] = write_holdout(comm, out, held, hplan, popts, sopts.key, options, files, job,
                                             store_fn, to_plan=lambda m: split_source(m, sopts.stages),
                                             shapes=plan.shapes, split=(split or {}).get("held"))
        del held
    return write_index(comm, out, plan, PlanRecord(options, files, prof, job, extra), store_fn)


def run_mixture(comm: Comm, mix: Mixture, output: str, aopts: AnalyzeOptions, sopts: SortOptions,
                popts: PackOptions, overwrite: bool, job: JobInfo, progress: bool = False,
                store: StoreOptions | None = None, holdout: HoldoutRequest | None = None) -> dict | None:
    """Plan a mixture in one job (analyze, one sort, pack, blend) and write its index; the manifest on rank 0.

    ``holdout`` (--holdout, --holdout-seed) and the sources' own ``holdout`` say what each source
    sets aside: those samples leave the plan before packing and form the held-out plan in
    ``OUTPUT/holdout`` (every held-out sample once, micro-batches by source, no blend).
    """
    check_options(comm, sopts.validate, popts.validate)
    _check_stages(mix, sopts)
    if popts.balance != "none":  # every rank parses the same options: all raise together
        raise SortpackError(f"--balance {popts.balance} does not apply to a mixture: its schedule orders the "
                            "micro-batches", collective=True)
    splitting = popts.oversize == "split" and str(aopts.size or "length") in SPLIT_KINDS
    plan_column, file_counts = _plan_column(comm, mix, aopts, store, splitting)
    if plan_column != aopts.column:  # a source's own column is read under the plan's name
        aopts = dataclasses.replace(aopts, column=plan_column)
    planned = PlanOptions(aopts, sopts, popts)
    check_options(comm, split_check(planned, _own_column(mix, aopts), aopts.tokenizer))
    renames = None
    if store is not None and store.enabled and file_counts is not None:
        renames = source_renames(plan_column, [src.column for src in mix.sources], file_counts)
    store_fn = store_for(comm, store, planned, aopts.tokenizer, renames)
    with job_scope(comm, output, overwrite, []) as scope:
        return _plan_mixture(comm, scope, mix, aopts, sopts, popts, job, progress, store_fn, holdout)
