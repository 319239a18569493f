"""The commands as library calls: which stage runs, which directory it reads and writes.

``run_analyze``, ``run_sort``, ``run_pack`` and ``run_all`` are what the CLI calls; each
is collective (every rank calls it) and returns the written manifest on rank 0. This
module only orchestrates: the stages are analyze.py, sort.py and pack/; metrics and
sorted directories are read and written by sample_dirs.py, the index by index_writer.py;
rows move between ranks in distribute.py; provenance.py times the stages; ``pipeline.job``
is the skeleton every job shares (options checked, store prepared, output opened, discarded
on failure).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

from ..env import env_flag
from ..errors import SortpackError
from ..format.kinds import rows_per_shard
from ..format.manifest import read_manifest
from ..inputs.columns import check_columns, first_columns, input_columns, reads_text, resolve_column
from ..inputs.locations import with_locations
from ..parallel import Comm, fault_point
from ..stages.analyze import AnalyzeOptions, Keepers, analyze
from ..stages.holdout import DEFAULT_SEED, DIRECTORY, Holdout, holdout_lengths, split_holdout
from ..stages.pack import Microbatches, OversizeError, PackOptions, pack_samples, refuse_oversize, truncate_length
from ..stages.plan_options import PlanOptions, measured_options
from ..stages.samples import SampleColumns
from ..stages.sort import SortOptions, sort_samples
from ..stages.split import SPLIT_KINDS, TargetPieces, byte_cuts, split_oversize
from ..write.index_writer import write_index
from ..write.kept import Dumped, dump_samples, keep_alone, keep_together
from ..write.output import OutputDir
from ..write.plan_record import PlanRecord
from ..write.provenance import JobInfo, Profile
from ..write.sample_dirs import read_samples, write_samples
from ..write.store import Store, StoreOptions
from .job import JobScope, check_options, hold_out_and_pack, job_scope, nested_plan, split_check, store_for

__all__ = ["HoldoutRequest", "JobInfo", "run_all", "run_analyze", "run_pack", "run_sort", "write_holdout"]


def split_column(comm: Comm, measured: AnalyzeOptions, popts: PackOptions, inputs: list[str]) -> str | None:
    """Return the column an ``--oversize split`` plan cuts: ``--column``, else the one analyze reads (collective).

    The store and the reader cut the column the plan's options name, so a split plan names it
    even where analyze chose it (the only column, or ``text``); other plans record ``--column``
    as given (None), which keeps their content hash.
    """
    column = measured.column
    if popts.oversize != "split" or column or measured.size not in SPLIT_KINDS or not inputs:
        return column
    files = input_columns(comm, [inputs], measured.input_format, measured.split)[0]
    return resolve_column(first_columns(files)) or column


def check_read_columns(comm: Comm, inputs: list[str], aopts: AnalyzeOptions, store: StoreOptions | None) -> None:
    """Refuse, before anything is measured, inputs without ``--column`` (where it is read) or a ``--store`` column."""
    storing = store is not None and store.enabled
    wanted = [(c, "--store") for c in store.columns] if store is not None and storing else []
    if aopts.column and reads_text(aopts.size, aopts.difficulty, storing and bool(store and store.tokens)):
        wanted.append((aopts.column, "--column"))
    if wanted:
        check_columns(input_columns(comm, [inputs], aopts.input_format, aopts.split)[0], wanted)


def _repack_hint(metrics: str, output: str, sopts: SortOptions, popts: PackOptions, oversize: bool) -> str:
    """Return the commands that sort and pack kept measurements without measuring again."""
    sort_flags = "".join(f" {flag}" for flag, on in ((f"--key {sopts.key}", sopts.key != "size"),
                                                      ("--descending", sopts.descending),
                                                      (f"--stages {sopts.stages}", sopts.stages > 1)) if on)
    pack_flags = f"--max-tokens {popts.max_tokens}" if not popts.rows else f"--rows {popts.rows}"
    if oversize:
        pack_flags += " --oversize split"
    return (f"The measured samples are kept in {metrics}: `sortpack sort {metrics} -o {output}.sorted{sort_flags} "
            f"&& sortpack pack {output}.sorted -o {output} {pack_flags} ...` packs them without measuring again")


def _kept_metrics(comm: Comm, out: OutputDir, overwrite: bool, inputs: list[str]) -> OutputDir | None:
    """Return where ``run`` keeps its measurements if it fails after analyze (None: OUTPUT.metrics is taken).

    Its temporary lives inside the output's: right after analyze each rank dumps its columns
    there (``write.kept``), made a metrics directory and moved out to OUTPUT.metrics only when
    the job fails; a directory already there is replaced only with ``--overwrite`` (else
    nothing is kept).
    """
    try:
        return OutputDir(comm, f"{out.path}.metrics", overwrite, inputs, inside=out)
    except SortpackError:  # raised on every rank together (the check is collective)
        return None


def split_sorted(comm: Comm, samples: SampleColumns, recorded: PlanOptions,
                 shape: Any = None) -> tuple[SampleColumns, dict]:
    """Return sorted samples with the oversize ones cut into pieces and sorted again (``pack --oversize split``).

    ``run`` splits before its sort; a sorted directory is split here and sorted once more with
    its recorded sort options, so the pieces are sorted by their own sizes too. ``shape``
    (fine-tuning data): each piece counts its own targets, the labels of the samples cut read
    back from the input files.
    """
    pieces = None
    if shape is not None:
        assert recorded.pack is not None, "a split is the pack options' choice"
        pieces, ids = comm.collectively(TargetPieces.read_back, samples, shape, truncate_length(recorded.pack), True)
    samples, split = split_oversize(comm, samples, recorded)  # recorded: --size bytes cuts the column
    if pieces is not None:
        samples = pieces.exact(ids, samples)  # before the sort: the pieces are still where their samples were
    if samples.begin is not None:
        samples = sort_samples(comm, samples, recorded.sort or SortOptions(), rows_per_shard("sorted"), consume=True)
    return samples, split


@dataclasses.dataclass(frozen=True)
class HoldoutRequest:
    """``--holdout N|FRACTION`` and ``--holdout-seed`` as parsed (``stages.holdout.parse_holdout``).

    ``value`` None: a mixture's seed alone (MIX.json says what each source holds out);
    ``seed`` None: MIX.json's ``holdout_seed``, else ``stages.holdout.DEFAULT_SEED``.
    """

    value: int | float | None
    seed: int | None = None


def _plain_holdout(request: HoldoutRequest | None, files: list[dict]) -> Holdout | None:
    """Return the holdout of a plan over one input (its rows from the fingerprint), or None."""
    if request is None or request.value is None:
        return None
    rows = int(sum(int(f["rows"]) for f in files))
    return Holdout.plan([request.value], [0, rows], [None], DEFAULT_SEED if request.seed is None else request.seed)


def write_holdout(comm: Comm, out: OutputDir, held: SampleColumns, holdout: Holdout, popts: PackOptions,
                  key: str, options: PlanOptions, files: list[dict], job: JobInfo, store_fn: Store | None = None,
                  to_plan=None, shapes: tuple[int, ...] = (), split: dict | None = None) -> dict:
    """Pack the held-out samples and write their plan in ``OUTPUT/holdout``; return the training manifest's record.

    Call it after packing the training plan: ``shapes`` are the lengths it used
    (``Microbatches.shapes``); with ``--shapes auto:K`` the held-out plan takes them, so
    evaluation sees the training's shapes (``stages.holdout.holdout_lengths``: plus one when
    a held-out sample is longer than all). ``options`` are the training plan's recorded
    options. ``to_plan(mbs)`` turns the packed micro-batches into the plan's (a mixture's:
    its ``source`` column); the record (every rank) carries the held-out plan's content hash.
    ``split``: what ``--oversize split`` did to the held-out documents (its stats), as
    ``stages.split.split_samples`` counts them (``info["held"]``).
    """
    nested, prof = nested_plan(out, DIRECTORY)
    hopts = dataclasses.replace(popts.with_shapes(shapes), auto_shapes=None)
    if popts.auto_shapes is not None and shapes:
        hopts = hopts.with_shapes(comm.collectively(holdout_lengths, comm, held.size, popts, shapes))
        # the lengths the training's --shapes auto:K chose, with one more: recorded with that request
        options = options.with_pack(dataclasses.replace(hopts, auto_shapes=popts.auto_shapes))
    with prof.stage("pack"):
        mbs: Microbatches = pack_samples(comm, held, hopts, key, split)
    if to_plan is not None:
        mbs = to_plan(mbs)
    record = holdout.as_dict()
    held_out = {**{k: v for k, v in record.items() if k != "directory"}, "training_plan": ".."}
    manifest = write_index(comm, nested, mbs, PlanRecord(options, files, prof, job, {"held_out": held_out}), store_fn)
    mine = None
    if manifest is not None:  # rank 0
        mine = {"content_hash": manifest["content_hash"], "num_microbatches": manifest["num_microbatches"],
                "packed_samples": manifest["num_samples"]}
        if manifest["stats"].get("empty_dropped"):
            # held out by id before packing: the empty ones among them are dropped (recorded
            # only when some are, so other plans keep their hash)
            mine["empty_dropped"] = manifest["stats"]["empty_dropped"]
    return {**record, **comm.bcast_obj(mine)}


def run_analyze(comm: Comm, inputs: list[str], output: str, aopts: AnalyzeOptions, overwrite: bool,
                job: JobInfo, progress: bool = False) -> dict | None:
    """Measure the inputs and write a metrics directory."""
    with job_scope(comm, output, overwrite, inputs) as scope:
        out, prof = scope.out, scope.prof
        with prof.stage("analyze"):
            samples = analyze(comm, inputs, aopts, progress)
        prof.counts["analyze_rows"] = len(samples)
        return write_samples(comm, out, "metrics", samples,
                             PlanRecord(measured_options(aopts, samples), samples.files, prof, job))


def run_sort(comm: Comm, metrics: str, output: str, sopts: SortOptions, overwrite: bool,
             job: JobInfo) -> dict | None:
    """Sort a metrics directory into a sorted directory."""
    check_options(comm, sopts.validate)
    with job_scope(comm, output, overwrite, [metrics]) as scope:
        out, prof = scope.out, scope.prof
        with prof.stage("read"):
            samples, measured = read_samples(comm, metrics, "metrics")
        with prof.stage("sort"):
            ordered = sort_samples(comm, samples, sopts, rows_per_shard("sorted"), consume=True)
        options = dataclasses.replace(measured, sort=sopts)
        return write_samples(comm, out, "sorted", ordered, PlanRecord(options, ordered.files, prof, job))


def run_pack(comm: Comm, sorted_dir: str, output: str, popts: PackOptions, overwrite: bool,
             job: JobInfo, store: StoreOptions | None = None, holdout: HoldoutRequest | None = None) -> dict | None:
    """Pack a sorted directory into an index directory (with ``store``: and its data shards; ``holdout``: and
    the held-out plan in ``OUTPUT/holdout``, the same as ``run --holdout`` writes)."""
    check_options(comm, popts.validate)
    sorted_manifest = comm.collectively(read_manifest, sorted_dir, "sorted")
    recorded = PlanOptions.from_manifest(sorted_manifest["options"]).with_pack(popts)
    column = split_column(comm, recorded.analyze, popts,
                          [f["path"] for f in with_locations(sorted_manifest) if "path" in f])
    if column != recorded.analyze.column:
        recorded = recorded.with_analyze(column=column)
    # fine-tuning data cut by --oversize split|truncate: the labels of the samples cut are read back and
    # encoded again, so each piece (or truncated sample) counts its own targets, as in run
    labels_read = recorded.analyze.fine_tune() is not None and popts.oversize in ("split", "truncate")
    check_options(comm, split_check(recorded, labels_read=labels_read))
    shape = None
    if labels_read:
        from ..inputs.finetune import recorded_shape

        opts = store or StoreOptions()
        shape = comm.collectively(recorded_shape, recorded.analyze.as_dict(), opts.tokenizer, opts.chat_template,
                                  f"pack --oversize {popts.oversize} of fine-tuning data")
    # the inputs are found through the sorted (or metrics) manifest's source fingerprint
    store_fn = store_for(comm, store, recorded, None)
    with job_scope(comm, output, overwrite, [sorted_dir]) as scope:
        out, prof = scope.out, scope.prof
        with prof.stage("read"):
            samples, _ = read_samples(comm, sorted_dir, "sorted")
        key = (recorded.sort or SortOptions()).key
        files = samples.files
        extra = None
        truncated = None
        if shape is not None and popts.oversize == "truncate":
            # before the held-out choice, as run counts them
            with prof.stage("split"):
                pieces, _ = comm.collectively(TargetPieces.read_back, samples, shape, truncate_length(popts), False)
                samples, lost = pieces.truncated(samples)
                truncated = {"truncated_targets": comm.allreduce(lost, "sum")}
        plan = comm.collectively(_plain_holdout, holdout, samples.files)
        held = None
        if plan is not None:
            # by sample id, before the pieces are cut: a document's pieces stay on one side
            with prof.stage("holdout_choice"):
                samples, held = split_holdout(comm, samples, plan)
        split, held_split = truncated, None
        if popts.oversize == "split":
            with prof.stage("split"):
                samples, split = split_sorted(comm, samples, recorded, shape)
                if held is not None:
                    held, held_split = split_sorted(comm, held, recorded, shape)
        with prof.stage("pack"):
            mbs = pack_samples(comm, samples, popts, key, split)
        options = recorded.with_pack(popts.with_shapes(mbs.shapes))  # --shapes auto: the chosen
        if plan is not None and held is not None:
            if store_fn is not None:
                store_fn.also_holdout()
            with prof.stage("holdout"):
                extra = {"holdout": write_holdout(comm, out, held, plan, popts, key, options, files, job, store_fn,
                                                  shapes=mbs.shapes, split=held_split)}
            del held
        return write_index(comm, out, mbs, PlanRecord(options, files, prof, job, extra), store_fn)


class _Measurements:
    """Where ``run`` keeps its measurements: OUTPUT.metrics and .sorted with --keep-intermediate, else a raw
    dump inside the output's temporary that becomes OUTPUT.metrics only when the job fails after analyze."""

    def __init__(self, comm: Comm, scope: JobScope, output: str, overwrite: bool, inputs: list[str],
                 keep_intermediate: bool):
        self.comm = comm
        self.keep_intermediate = keep_intermediate
        self.extra: list[OutputDir] = []
        if keep_intermediate:
            self.extra = [scope.also(OutputDir(comm, f"{output}.metrics", overwrite, inputs)),
                          scope.also(OutputDir(comm, f"{output}.sorted", overwrite, inputs))]
        # the measurements outlive a failure after analyze (an oversize sample, an error in sort or pack);
        # SORTPACK_NO_KEEP=1 keeps nothing (what the benchmark compares the dump's cost with)
        self.kept = self.extra[0] if keep_intermediate else (
            None if env_flag("SORTPACK_NO_KEEP") else _kept_metrics(comm, scope.out, overwrite, inputs))
        self.written = False  # --keep-intermediate: OUTPUT.metrics is committed
        self.dumped: Dumped | None = None
        self.prof: Profile | None = None
        self.job: JobInfo | None = None

    def write_metrics(self, samples: SampleColumns, measured: PlanOptions, prof: Profile, job: JobInfo) -> None:
        """Write the metrics directory (--keep-intermediate: committed at once), or dump what a failure keeps."""
        if self.keep_intermediate:
            write_samples(self.comm, self.extra[0], "metrics", samples, PlanRecord(measured, samples.files, prof, job))
            self.written = True
        elif self.kept is not None:
            self.prof, self.job = prof, job
            with prof.stage("keep_measurements"):
                # analyze numbers each rank's samples from its first row: the ids need not be written
                self.dumped = dump_samples(self.comm, self.kept, samples, measured, ids_from_start=True)

    def write_sorted(self, ordered: SampleColumns, options: PlanOptions, prof: Profile, job: JobInfo) -> None:
        """Write the sorted directory with --keep-intermediate (else nothing)."""
        if self.keep_intermediate:
            write_samples(self.comm, self.extra[1], "sorted", ordered, PlanRecord(options, ordered.files, prof, job))

    def done(self) -> None:
        """Drop the dump kept only to survive a failure: the job succeeded."""
        if self.kept is not None and not self.keep_intermediate:
            self.kept.discard()

    def _keep(self, exc: Exception) -> str | None:
        """Return the kept metrics directory after a failure past analyze (None: nothing kept).

        An error raised together on every rank is written by all ranks and moved into place by
        rank 0; an error on one rank by that rank alone from every rank's dump (the others are
        blocked or aborted).
        """
        kept, dumped = self.kept, self.dumped
        if kept is None or dumped is None or self.prof is None or self.job is None:
            return None
        together = (isinstance(exc, SortpackError) and exc.collective) or self.comm.size == 1
        there = dumped.directory.is_dir()
        # the dump lies in the output's temporary, which a failed commit (another job wrote OUTPUT
        # meanwhile) has removed already: nothing is kept then, and the job's own error stands
        if not (self.comm.allreduce(int(there), "min") if together else there):
            return None
        if together:
            manifest = keep_together(self.comm, kept, dumped, self.prof, self.job)
            if manifest is None:
                return None
            if not self.comm.is_root():
                return str(kept.path)  # rank 0 moves it; only rank 0 prints a collective error
        else:
            manifest = keep_alone(kept, dumped, self.job)
        return str(kept.path) if manifest is not None and kept.commit_alone(manifest) else None

    def failed(self, exc: Exception, output: str, sopts: SortOptions, popts: PackOptions) -> Exception | None:
        """Return the error to raise instead of ``exc``, naming where the measurements are kept (None: ``exc``)."""
        if self.keep_intermediate:
            where = str(self.extra[0].path) if self.written else None
        else:
            where = self._keep(exc)
        if where is None:
            return None
        hint = _repack_hint(where, output, sopts, popts, isinstance(exc, OversizeError))
        if isinstance(exc, SortpackError):
            cls = type(exc) if type(exc) in (SortpackError, OversizeError) else SortpackError
            return cls(f"{exc}. {hint}", exc.collective)
        sys.stderr.write(f"sortpack: {hint}\n")
        return None


def _measure(comm: Comm, scope: JobScope, keep: _Measurements, inputs: list[str], aopts: AnalyzeOptions,
             popts: PackOptions, job: JobInfo, progress: bool, store_fn: Store | None,
             holdout: HoldoutRequest | None) -> tuple[SampleColumns, PlanOptions, Holdout | None, dict | None]:
    """Return (the measured samples, cut with --oversize split, their recorded options, the holdout, the split)."""
    out, prof = scope.out, scope.prof
    sink = store_fn.token_cache(out) if store_fn is not None else None  # ids kept, not re-tokenized
    with prof.stage("analyze"):
        cuts = byte_cuts(aopts, popts)  # --size bytes --oversize split: cut while the text is read
        pieces = None
        if popts.oversize in ("split", "truncate") and aopts.fine_tune() is not None:
            pieces = TargetPieces(truncate_length(popts))  # each piece's targets, counted while the labels are read
        samples = analyze(comm, inputs, aopts, progress, Keepers(sink, cuts or pieces))
    prof.counts["analyze_rows"] = len(samples)
    plan = comm.collectively(_plain_holdout, holdout, samples.files)  # a bad count fails before the sort
    measured = measured_options(aopts, samples)
    keep.write_metrics(samples, measured, prof, job)
    fault_point(comm, "after_analyze")
    refuse_oversize(comm, samples, popts)  # fail fast: before the sort, not after it
    split = None
    if pieces is not None and popts.oversize == "truncate":
        samples, lost = pieces.truncated(samples)
        split = {"truncated_targets": comm.allreduce(lost, "sum")}  # the pack's stats report it
    if popts.oversize == "split":
        # before the sort: the pieces are sorted by their own sizes
        with prof.stage("split"):
            before = samples.sample_id
            samples, split = split_oversize(comm, samples, measured.with_pack(popts), cuts,
                                            plan.mask if plan is not None else None)
            if pieces is not None:
                samples = pieces.exact(before, samples)
    return samples, measured, plan, split


def _plan_dataset(comm: Comm, scope: JobScope, keep: _Measurements, inputs: list[str], aopts: AnalyzeOptions,
                  sopts: SortOptions, popts: PackOptions, job: JobInfo, progress: bool, store_fn: Store | None,
                  holdout: HoldoutRequest | None) -> dict | None:
    """Analyze, sort, hold out, pack and write the index of ``run``; return the manifest on rank 0."""
    out, prof = scope.out, scope.prof
    samples, measured, plan, split = _measure(comm, scope, keep, inputs, aopts, popts, job, progress, store_fn,
                                              holdout)
    with prof.stage("sort"):
        ordered = sort_samples(comm, samples, sopts, rows_per_shard("sorted"), consume=True)
    del samples
    options = dataclasses.replace(measured, sort=sopts)
    keep.write_sorted(ordered, options, prof, job)
    files = ordered.files
    record = None
    # `pack SORTED --holdout` repeats the held-out choice exactly
    ordered, held, mbs = hold_out_and_pack(comm, prof, ordered, plan, popts, sopts.key, split)
    del ordered
    options = options.with_pack(popts.with_shapes(mbs.shapes))
    if plan is not None and held is not None:
        if store_fn is not None:
            store_fn.also_holdout()
        with prof.stage("holdout"):
            record = write_holdout(comm, out, held, plan, popts, sopts.key, options, files, job, store_fn,
                                   shapes=mbs.shapes, split=(split or {}).get("held"))
        del held
    extra = {"holdout": record} if record is not None else None
    manifest = write_index(comm, out, mbs, PlanRecord(options, files, prof, job, extra), store_fn)
    keep.done()
    return manifest


def run_all(comm: Comm, inputs: list[str], output: str, aopts: AnalyzeOptions, sopts: SortOptions,
            popts: PackOptions, overwrite: bool, job: JobInfo, keep_intermediate: bool = False,
            progress: bool = False, store: StoreOptions | None = None,
            holdout: HoldoutRequest | None = None) -> dict | None:
    """Analyze, sort and pack in one job (no intermediate files unless asked; ``store``: data shards too;
    ``holdout``: and the held-out plan in ``OUTPUT/holdout``)."""
    check_options(comm, sopts.validate, popts.validate)
    column = split_column(comm, aopts, popts, inputs)
    if column != aopts.column:
        aopts = dataclasses.replace(aopts, column=column)
    planned = PlanOptions(aopts, sopts, popts)
    check_options(comm, split_check(planned, tokenizer=aopts.tokenizer, labels_read=True))
    store_fn = store_for(comm, store, planned, aopts.tokenizer)
    check_read_columns(comm, inputs, aopts, store)
    with job_scope(comm, output, overwrite, inputs) as scope:
        keep = _Measurements(comm, scope, output, overwrite, inputs, keep_intermediate)
        try:
            return _plan_dataset(comm, scope, keep, inputs, aopts, sopts, popts, job, progress, store_fn, holdout)
        except Exception as exc:  # a signal or ^C: nothing stays
            # the measurements move out of the output's temporary before the scope drops it
            instead = keep.failed(exc, output, sopts, popts)
            if instead is None:
                raise
            raise instead from None
