"""The commands as library calls: which stage runs, which directory it reads and writes.

``run_analyze``, ``run_sort``, ``run_pack`` and ``run_all`` are what the CLI calls; each
is collective (every rank calls it) and returns the written manifest on rank 0. This
module only orchestrates, as a recipe: ``pipeline.job`` is the skeleton every job shares
(options checked, store prepared, output opened, discarded on failure), ``pipeline.columns``
the column policy, ``pipeline.tail`` the end every plan shares (hold out, pack, write the
held-out plan and the index) and ``pipeline.kept`` where ``run`` keeps its measurements; the
stages are ``stages/``, the directories are written by ``write/``.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..format.kinds import rows_per_shard
from ..format.manifest import read_manifest
from ..inputs.locations import with_locations
from ..inputs.size_kinds import split_kinds
from ..parallel import Comm, fault_point
from ..stages.analyze import AnalyzeOptions, Keepers, analyze
from ..stages.pack import PackOptions, refuse_oversize, truncate_length
from ..stages.plan_options import PlanOptions, measured_options
from ..stages.samples import SampleColumns
from ..stages.sort import SortOptions, sort_samples
from ..write.plan_record import PlanRecord
from ..write.provenance import JobInfo
from .columns import ColumnRequest, read_columns
from .job import HoldoutRequest, JobOutput, PlanJob, check_options, job_scope, split_check, store_for
from .kept import Measurements
from .tail import Tail, pack_check, training_split

if TYPE_CHECKING:
    from ..inputs.finetune import FineTuneShape
    from ..stages.holdout import Holdout
    from ..write.store import StoreOptions

# Loaded where used, not with the module: the metrics and sorted directories (``write.sample_dirs``: the
# analyze, sort and pack commands), a held-out plan (``stages.holdout``), fine-tuning data (``inputs.finetune``),
# samples cut or truncated (``stages.split``: --oversize split|truncate), the store's options (``write.store``).
# A plain ``run`` uses none of them, and every rank pays for a module before its first stage.
__all__ = ["HoldoutRequest", "JobInfo", "JobOutput", "run_all", "run_analyze", "run_pack", "run_sort"]


def _plain_holdout(request: HoldoutRequest | None, files: list[dict]) -> Holdout | None:
    """Return the holdout of a plan over one input (its rows from the fingerprint), or None."""
    if request is None or request.value is None:
        return None
    from ..stages.holdout import DEFAULT_SEED, Holdout

    rows = int(sum(int(f["rows"]) for f in files))
    return Holdout.plan([request.value], [0, rows], [None], DEFAULT_SEED if request.seed is None else request.seed)


def run_analyze(comm: Comm, inputs: list[str], aopts: AnalyzeOptions, output: JobOutput) -> dict | None:
    """Measure the inputs and write a metrics directory; return its manifest on rank 0."""
    from ..write.sample_dirs import write_samples

    check_options(comm, aopts.validate)
    aopts = comm.collectively(aopts.resolved)
    with job_scope(comm, output.path, output.overwrite, inputs) as scope:
        out, prof = scope.out, scope.prof
        with prof.stage("analyze"):
            samples = analyze(comm, inputs, aopts, output.progress)
        prof.counts["analyze_rows"] = len(samples)
        return write_samples(comm, out, "metrics", samples,
                             PlanRecord(measured_options(aopts, samples), samples.files, prof, output.info))


def run_sort(comm: Comm, metrics: str, sopts: SortOptions, output: JobOutput) -> dict | None:
    """Sort a metrics directory into a sorted directory; return its manifest on rank 0."""
    from ..write.sample_dirs import read_samples, write_samples

    check_options(comm, sopts.validate)
    with job_scope(comm, output.path, output.overwrite, [metrics]) as scope:
        out, prof = scope.out, scope.prof
        with prof.stage("read"):
            samples, measured = read_samples(comm, metrics, "metrics")
        with prof.stage("sort"):
            ordered = sort_samples(comm, samples, sopts, rows_per_shard("sorted"), consume=True)
        options = dataclasses.replace(measured, sort=sopts)
        return write_samples(comm, out, "sorted", ordered, PlanRecord(options, ordered.files, prof, output.info))


def _split_sorted(job: PlanJob, samples: SampleColumns, recorded: PlanOptions, shape: FineTuneShape | None
                  ) -> tuple[SampleColumns, dict]:
    """Return sorted samples with the oversize ones cut into pieces and sorted again (``pack --oversize split``).

    ``run`` splits before its sort; a sorted directory is split here and sorted once more with
    its recorded sort options, so the pieces are sorted by their own sizes too. ``shape``
    (fine-tuning data): each piece counts its own targets, the labels of the samples cut read
    back from the input files.
    """
    from ..stages.split import split_oversize
    from ..stages.split_targets import TargetPieces

    pieces = None
    if shape is not None:
        pieces, ids = job.comm.collectively(TargetPieces.read_back, samples, shape, truncate_length(job.popts), True)
    samples, split = split_oversize(job.comm, samples, recorded)  # recorded: --size bytes cuts the column
    if pieces is not None:
        samples = pieces.exact(ids, samples)  # before the sort: the pieces are still where their samples were
    if samples.begin is not None:
        samples = sort_samples(job.comm, samples, job.sopts, rows_per_shard("sorted"), consume=True)
    return samples, split


def _recorded_shape(comm: Comm, recorded: PlanOptions, store: StoreOptions | None) -> FineTuneShape:
    """Return the fine-tuning shape a sorted directory was measured with, loaded again with ``pack``'s
    ``--tokenizer`` and ``--chat-template`` (collective: a missing or different file is one line)."""
    from ..write.store import StoreOptions

    opts, measured = store or StoreOptions(), recorded.analyze
    assert measured.shape is not None
    why = f"pack --oversize {recorded.pack.oversize if recorded.pack else ''} of fine-tuning data"
    return comm.collectively(measured.shape.loaded_from, opts.tokenizer, measured.tokenizer, opts.chat_template, why)


def _truncated_targets(job: PlanJob, samples: SampleColumns, shape: FineTuneShape) -> tuple[SampleColumns, dict]:
    """Return the samples cut to the budget (``pack --oversize truncate`` of fine-tuning data) and the targets the
    cut lost (the pack's stats report them), their labels read back from the input files."""
    from ..stages.split_targets import TargetPieces

    comm = job.comm
    pieces, _ = comm.collectively(TargetPieces.read_back, samples, shape, truncate_length(job.popts), False)
    samples, lost = pieces.truncated(samples)
    return samples, {"truncated_targets": comm.allreduce(lost, "sum")}


def _recorded_plan(comm: Comm, sorted_dir: str, popts: PackOptions) -> PlanOptions:
    """Return the options a sorted directory records, packed with ``popts`` (a split plan: naming the column it
    cuts, found through the directory's source fingerprint; collective)."""
    sorted_manifest = comm.collectively(read_manifest, sorted_dir, "sorted")
    recorded = PlanOptions.from_manifest(sorted_manifest["options"]).with_pack(popts)
    measured = recorded.analyze
    request = ColumnRequest(measured.column, splitting=popts.oversize == "split" and measured.size in split_kinds())
    column = read_columns(comm, request, [[f["path"] for f in with_locations(sorted_manifest) if "path" in f]],
                          measured.input_format, measured.split).column
    return recorded.with_analyze(column=column) if column != measured.column else recorded


def run_pack(comm: Comm, sorted_dir: str, popts: PackOptions, output: JobOutput) -> dict | None:
    """Pack a sorted directory into an index directory; return its manifest on rank 0.

    ``output.store``: and its data shards; ``output.holdout``: and the held-out plan in
    ``OUTPUT/holdout``, the same as ``run --holdout`` writes.
    """
    from ..write.sample_dirs import read_samples

    check_options(comm, popts.validate)
    recorded = _recorded_plan(comm, sorted_dir, popts)
    measured = recorded.analyze
    # fine-tuning data cut by --oversize split|truncate: the labels of the samples cut are read back and
    # encoded again, so each piece (or truncated sample) counts its own targets, as in run
    labels_read = measured.shape is not None and popts.oversize in ("split", "truncate")
    check_options(comm, pack_check(recorded), split_check(recorded, labels_read=labels_read))
    shape = _recorded_shape(comm, recorded, output.store) if labels_read else None
    store_fn = store_for(comm, output.store, recorded, None)
    sopts = recorded.sort or SortOptions()
    with job_scope(comm, output.path, output.overwrite, [sorted_dir]) as scope:
        plan_job = PlanJob(comm, scope, output.info, sopts, popts, store_fn)
        with scope.prof.stage("read"):
            samples, _ = read_samples(comm, sorted_dir, "sorted")
        split = None
        if shape is not None and popts.oversize == "truncate":
            # before the held-out choice, as run counts them
            with scope.prof.stage("split"):
                samples, split = _truncated_targets(plan_job, samples, shape)
        holdout = comm.collectively(_plain_holdout, output.holdout, samples.files)
        tail = Tail(plan_job, sopts.key, samples.files, holdout)
        # by sample id, before the pieces are cut: a document's pieces stay on one side
        samples = tail.hold_out(samples)
        if popts.oversize == "split":
            with scope.prof.stage("split"):
                samples, split = _split_sorted(plan_job, samples, recorded, shape)
                if tail.held is not None:
                    tail.held, tail.held_split = _split_sorted(plan_job, tail.held, recorded, shape)
        mbs = tail.pack(samples, split)
        del samples
        return tail.write(mbs, recorded.with_pack(popts.with_shapes(mbs.shapes)))  # --shapes auto: the chosen


def _measure(job: PlanJob, keep: Measurements, inputs: list[str], aopts: AnalyzeOptions,
             holdout: HoldoutRequest | None) -> tuple[SampleColumns, PlanOptions, Holdout | None, dict | None]:
    """Return (the measured samples, cut with --oversize split, their recorded options, the holdout, the split)."""
    comm, prof, popts = job.comm, job.prof, job.popts
    sink = job.store.token_cache(job.out) if job.store is not None else None  # ids kept, not re-tokenized
    with prof.stage("analyze"):
        cuts = pieces = None
        if popts.oversize in ("split", "truncate"):  # samples cut or truncated: a plain run loads none of it
            from ..stages.split import byte_cuts
            from ..stages.split_targets import TargetPieces

            cuts = byte_cuts(aopts, popts)  # --size bytes --oversize split: cut while the text is read
            if aopts.shape is not None:
                pieces = TargetPieces(truncate_length(popts))  # each piece's targets, counted as the labels are read
        samples = analyze(comm, inputs, aopts, job.progress, Keepers(sink, cuts or pieces))
    prof.counts["analyze_rows"] = len(samples)
    plan = comm.collectively(_plain_holdout, holdout, samples.files)  # a bad count fails before the sort
    measured = measured_options(aopts, samples)
    keep.write_metrics(samples, measured, prof, job.info)
    fault_point(comm, "after_analyze")
    refuse_oversize(comm, samples, popts)  # fail fast: before the sort, not after it
    split = None
    if pieces is not None and popts.oversize == "truncate":
        samples, lost = pieces.truncated(samples)
        split = {"truncated_targets": comm.allreduce(lost, "sum")}  # the pack's stats report it
    if popts.oversize == "split":
        from ..stages.split import split_oversize

        # before the sort: the pieces are sorted by their own sizes
        with prof.stage("split"):
            before = samples.sample_id
            samples, split = split_oversize(comm, samples, measured.with_pack(popts), cuts,
                                            plan.mask if plan is not None else None)
            if pieces is not None:
                samples = pieces.exact(before, samples)
    return samples, measured, plan, split


def _plan_dataset(job: PlanJob, keep: Measurements, inputs: list[str], aopts: AnalyzeOptions,
                  holdout: HoldoutRequest | None) -> dict | None:
    """Analyze, sort, hold out, pack and write the index of ``run``; return the manifest on rank 0."""
    samples, measured, plan, split = _measure(job, keep, inputs, aopts, holdout)
    with job.prof.stage("sort"):
        ordered = sort_samples(job.comm, samples, job.sopts, rows_per_shard("sorted"), consume=True)
    del samples
    options = dataclasses.replace(measured, sort=job.sopts)
    keep.write_sorted(ordered, options, job.prof, job.info)
    # `pack SORTED --holdout` repeats the held-out choice exactly
    tail = Tail(job, job.sopts.key, ordered.files, plan)
    tail.held_split = (split or {}).get("held")
    ordered = tail.hold_out(ordered)
    mbs = tail.pack(ordered, training_split(split))
    del ordered
    manifest = tail.write(mbs, options.with_pack(job.popts.with_shapes(mbs.shapes)))
    keep.done()
    return manifest


def run_all(comm: Comm, inputs: list[str], plan: PlanOptions, output: JobOutput) -> dict | None:
    """Analyze, sort and pack in one job; return the index's manifest on rank 0.

    No intermediate files unless ``output.keep_intermediate``; ``output.store``: data shards
    too; ``output.holdout``: and the held-out plan in ``OUTPUT/holdout``.
    """
    aopts, sopts, popts = plan.analyze, plan.sort or SortOptions(), plan.pack or PackOptions()
    store = output.store
    check_options(comm, sopts.validate, popts.validate, aopts.validate, pack_check(PlanOptions(aopts, sopts, popts)))
    aopts = comm.collectively(aopts.resolved)
    columns = read_columns(comm, ColumnRequest.of(aopts, popts.oversize, store), [inputs], aopts.input_format,
                           aopts.split)
    if columns.column != aopts.column:  # a split plan names the column it cuts
        aopts = dataclasses.replace(aopts, column=columns.column)
    planned = PlanOptions(aopts, sopts, popts)
    check_options(comm, split_check(planned, tokenizer=aopts.tokenizer, labels_read=True))
    store_fn = store_for(comm, store, planned, aopts.tokenizer)
    with job_scope(comm, output.path, output.overwrite, inputs) as scope:
        keep = Measurements(scope, output.path, output.overwrite, inputs, output.keep_intermediate)
        try:
            job = PlanJob(comm, scope, output.info, sopts, popts, store_fn, output.progress)
            return _plan_dataset(job, keep, inputs, aopts, output.holdout)
        except Exception as exc:  # a signal or ^C: nothing stays
            # the measurements move out of the output's temporary before the scope drops it
            instead = keep.failed(exc, output.path, sopts, popts)
            if instead is None:
                raise
            raise instead from None
