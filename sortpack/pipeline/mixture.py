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

This module only orchestrates: the union and its analysis, the part passes, the blend, the
move and the ``mixture`` record are ``stages.mixture``'s; ``pipeline.columns`` says which
column each source reads, ``pipeline.tail`` holds out, packs and writes both plans as for
any plan, and ``pipeline.job`` is the skeleton of the job.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import SortpackError
from ..format.kinds import rows_per_shard, samples_per_shard
from ..inputs.mixture import Mixture
from ..inputs.renames import source_renames
from ..parallel import Comm
from ..stages.analyze import AnalyzeOptions
from ..stages.mixture import (
    IndexShards,
    MixturePacking,
    ReadWith,
    analyze_union,
    blend_mixture,
    choose_part_passes,
    global_ids,
    holdout_plan,
    own_column,
    pack_part_passes,
    split_source,
    split_union,
)
from ..stages.pack import PackOptions, refuse_oversize
from ..stages.pack.balance import balance_of
from ..stages.plan_options import PlanOptions
from ..stages.sort import SortOptions, sort_samples
from ..stages.split import byte_cuts
from ..write.store import StoreOptions
from .columns import ColumnRequest, read_columns
from .job import HoldoutRequest, JobOutput, PlanJob, check_options, job_scope, split_check, store_for
from .tail import Tail, pack_check, training_split

__all__ = ["run_mixture"]


def _check_stages(mix: Mixture, sopts: SortOptions) -> None:
    """Refuse more curriculum stages than the int16 code ``source * stages + stage`` holds (every rank)."""
    k = len(mix.sources)
    if k * sopts.stages > np.iinfo(np.int16).max:
        raise SortpackError(f"--stages {sopts.stages} with {k} mixture sources: at most "
                            f"{np.iinfo(np.int16).max // k} stages", collective=True)  # every rank, after collectives


def _plan_mixture(job: PlanJob, mix: Mixture, aopts: AnalyzeOptions, holdout: HoldoutRequest | None) -> dict | None:
    """Analyze, sort, hold out, pack, blend and write the mixture's index; return the manifest on rank 0."""
    comm, prof, sopts, popts = job.comm, job.prof, job.sopts, job.popts
    sink = job.store.token_cache(job.out) if job.store is not None else None  # ids kept, not re-tokenized
    with prof.stage("analyze"):
        cuts = byte_cuts(aopts, popts)  # --size bytes --oversize split: cut while the text is read
        union = analyze_union(comm, mix, aopts, ReadWith(job.progress, sink, cuts))
    prof.counts["analyze_rows"] = len(union.samples)
    refuse_oversize(comm, union.samples, popts)  # fail fast: before the sort, as `run` does
    sources = union.sources
    hplan = comm.collectively(holdout_plan, mix, holdout.value if holdout is not None else None,
                              holdout.seed if holdout is not None else None, sources.bases)  # fails before the sort
    split = None
    if popts.oversize == "split":
        # before the sort, as `run` cuts: pieces are sorted by their own sizes, each in its source
        with prof.stage("split"):
            union, split = split_union(comm, union, PlanOptions(aopts, sopts, popts), hplan)
    with prof.stage("sort"):
        # by (source, key, id); the stage comes back as source * stages + stage, so the
        # pieces of packing end where the source (or the stage) changes
        ordered = sort_samples(comm, union.samples, sopts, rows_per_shard("sorted"), consume=True,
                               groups=union.groups)
        del union
        if sources.table is not None:
            global_ids(sources.table, ordered.sample_id)
    # by global sample id (docs/mixtures.md)
    tail = Tail(job, sopts.key, sources.files, hplan)
    tail.held_split = (split or {}).get("held")
    ordered = tail.hold_out(ordered)
    mbs = tail.pack(ordered, training_split(split))
    how = MixturePacking(mix, popts, sopts.key, sopts.stages, sources)
    with prof.stage("part_pass"):
        # the uses past the whole passes: a seeded subset of samples, packed on its own
        packed, chosen = choose_part_passes(comm, ordered, mbs, how)
        del ordered
        mbs, packed = pack_part_passes(comm, chosen, mbs, packed, how)
        del chosen
    with prof.stage("blend"):
        plan, record = blend_mixture(comm, mbs, packed, how, IndexShards(rows_per_shard("index"), samples_per_shard()))
    del mbs
    options = PlanOptions(aopts, sopts, popts.with_shapes(plan.shapes))
    return tail.write(plan, options, extra={"mixture": record}, to_plan=lambda m: split_source(m, sopts.stages))


def _plan_column(comm: Comm, mix: Mixture, aopts: AnalyzeOptions, popts: PackOptions, store: StoreOptions | None
                 ) -> tuple[AnalyzeOptions, list[int] | None]:
    """Return (the options with the plan's column, each source's file count or None), refusing a missing column
    before analyze (``pipeline.columns``)."""
    request = ColumnRequest.of(aopts, popts.oversize, store, tuple((src.name, src.column) for src in mix.sources))
    columns = read_columns(comm, request, [list(src.inputs) for src in mix.sources], aopts.input_format, aopts.split)
    if columns.column != aopts.column:  # a source's own column is read under the plan's name
        aopts = dataclasses.replace(aopts, column=columns.column)
    return aopts, columns.file_counts


def run_mixture(comm: Comm, mix: Mixture, plan: PlanOptions, output: JobOutput) -> dict | None:
    """Plan a mixture in one job (analyze, one sort, pack, blend) and write its index; the manifest on rank 0.

    ``output.holdout`` (--holdout, --holdout-seed) and the sources' own ``holdout`` say what each
    source sets aside: those samples leave the plan before packing and form the held-out plan in
    ``OUTPUT/holdout`` (every held-out sample once, micro-batches by source, no blend).
    """
    aopts, sopts, popts = plan.analyze, plan.sort or SortOptions(), plan.pack or PackOptions()
    store = output.store
    check_options(comm, sopts.validate, popts.validate, aopts.validate, pack_check(PlanOptions(aopts, sopts, popts)))
    aopts = comm.collectively(aopts.resolved)
    _check_stages(mix, sopts)
    if balance_of(popts).orders:  # every rank parses the same options: all raise together
        raise SortpackError(f"--balance {popts.balance} does not apply to a mixture: its schedule orders the "
                            "micro-batches", collective=True)
    aopts, file_counts = _plan_column(comm, mix, aopts, popts, store)
    planned = PlanOptions(aopts, sopts, popts)
    check_options(comm, split_check(planned, own_column(mix, aopts), aopts.tokenizer))
    renames = None
    if store is not None and store.enabled and file_counts is not None:
        renames = source_renames(aopts.column, [src.column for src in mix.sources], file_counts)
    store_fn = store_for(comm, store, planned, aopts.tokenizer, renames)
    with job_scope(comm, output.path, output.overwrite, []) as scope:
        job = PlanJob(comm, scope, output.info, sopts, popts, store_fn, output.progress)
        return _plan_mixture(job, mix, aopts, output.holdout)
