"""The commands as library calls: which stage runs, which directory it reads and writes.

``run_analyze``, ``run_sort``, ``run_pack`` and ``run_all`` are what the CLI calls; each
is collective (every rank calls it) and returns the written manifest on rank 0. This
module only orchestrates: the stages are analyze.py, sort.py and pack/; metrics and
sorted directories are read and written by sample_dirs.py, the index by index_writer.py;
rows move between ranks in distribute.py; provenance.py times the stages.
"""
from __future__ import annotations

import sys

from ..errors import SortpackError
from ..format.kinds import rows_per_shard
from ..format.manifest import read_manifest
from ..inputs.fingerprints import with_mtimes
from ..parallel import Comm, fault_point
from ..stages.analyze import AnalyzeOptions, analyze, measured_options
from ..stages.pack import OversizeError, PackOptions, pack_samples, refuse_oversize
from ..stages.samples import SampleColumns
from ..stages.sort import SortOptions, sort_samples
from ..stages.split import check_split, split_oversize
from ..write.index_writer import write_index
from ..write.output import OutputDir
from ..write.provenance import JobInfo, Profile
from ..write.sample_dirs import read_samples, write_samples
from ..write.store import StoreOptions, prepare

__all__ = ["JobInfo", "run_all", "run_analyze", "run_pack", "run_sort"]


def _guarded(outs: OutputDir | list[OutputDir], fn):
    try:
        return fn()
    except BaseException:
        # a collective error leaves every rank here: drop the half-written directories
        for out in outs if isinstance(outs, list) else [outs]:
            out.discard()
        raise


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

    The directory is written right after analyze, inside the output's temporary, and moves
    out to OUTPUT.metrics only when the job fails; a directory already there is replaced
    only with ``--overwrite`` (else nothing is kept).
    """
    try:
        return OutputDir(comm, f"{out.path}.metrics", overwrite, inputs, inside=out)
    except SortpackError:  # raised on every rank together (the check is collective)
        return None


def _keep_on_failure(comm: Comm, kept: OutputDir | None, manifest: dict | None, exc: Exception) -> str | None:
    """Return the kept metrics directory after a failure past analyze (None: nothing kept).

    A user error raised together on every rank is kept by rank 0; an error on one rank by
    that rank alone (the others are blocked or aborted): the shards are all written already.
    """
    if kept is None or manifest is None:
        return None
    collective = isinstance(exc, SortpackError) and exc.collective
    if collective and not comm.is_root():
        return str(kept.path)  # rank 0 keeps it; only rank 0 prints a collective error
    return str(kept.path) if kept.commit_alone(manifest) else None


def split_sorted(comm: Comm, samples: SampleColumns, popts: PackOptions, recorded: dict
                 ) -> tuple[SampleColumns, dict]:
    """Return sorted samples with the oversize ones cut into pieces and sorted again (``pack --oversize split``).

    ``run`` splits before its sort; a sorted directory is split here and sorted once more with
    its recorded sort options, so the pieces are sorted by their own sizes too.
    """
    samples, split = split_oversize(comm, samples, popts)
    if samples.begin is not None:
        sopts = SortOptions(key=recorded.get("key", "size"), descending=bool(recorded.get("descending", False)),
                            stages=int(recorded.get("stages", 1)))
        samples = sort_samples(comm, samples, sopts, rows_per_shard("sorted"), consume=True)
    return samples, split


def run_analyze(comm: Comm, inputs: list[str], output: str, aopts: AnalyzeOptions, overwrite: bool,
                job: JobInfo, progress: bool = False) -> dict | None:
    """Measure the inputs and write a metrics directory."""
    out = OutputDir(comm, output, overwrite, inputs)
    prof = Profile(comm)

    def work():
        with prof.stage("analyze"):
            samples = analyze(comm, inputs, aopts, progress)
        prof.counts["analyze_rows"] = len(samples)
        return write_samples(comm, out, "metrics", samples, measured_options(aopts, samples), prof, job)

    return _guarded(out, work)


def run_sort(comm: Comm, metrics: str, output: str, sopts: SortOptions, overwrite: bool,
             job: JobInfo) -> dict | None:
    """Sort a metrics directory into a sorted directory."""
    comm.collectively(sopts.validate)
    out = OutputDir(comm, output, overwrite, [metrics])
    prof = Profile(comm)

    def work():
        with prof.stage("read"):
            samples, manifest = read_samples(comm, metrics, "metrics")
        with prof.stage("sort"):
            ordered = sort_samples(comm, samples, sopts, rows_per_shard("sorted"), consume=True)
        options = {**manifest["options"], **sopts.as_dict()}
        return write_samples(comm, out, "sorted", ordered, options, prof, job)

    return _guarded(out, work)


def run_pack(comm: Comm, sorted_dir: str, output: str, popts: PackOptions, overwrite: bool,
             job: JobInfo, store: StoreOptions | None = None) -> dict | None:
    """Pack a sorted directory into an index directory (with ``store``: and its data shards)."""
    comm.collectively(popts.validate)
    store_fn = None
    recorded = comm.collectively(read_manifest, sorted_dir, "sorted")["options"]
    if popts.oversize == "split":
        comm.collectively(check_split, recorded)
    if store is not None and store.enabled:
        # the inputs are found through the sorted (or metrics) manifest's source fingerprint
        store_fn = prepare(comm, store, recorded, popts, None)
    out = OutputDir(comm, output, overwrite, [sorted_dir])
    prof = Profile(comm)

    def work():
        with prof.stage("read"):
            samples, manifest = read_samples(comm, sorted_dir, "sorted")
        key = manifest["options"].get("key", "size")
        split = None
        if popts.oversize == "split":
            with prof.stage("split"):
                samples, split = split_sorted(comm, samples, popts, manifest["options"])
        with prof.stage("pack"):
            mbs = pack_samples(comm, samples, popts, key, split)
        options = {**manifest["options"], **popts.as_dict()}
        return write_index(comm, out, mbs, options, with_mtimes(manifest), prof, job, store_fn)

    return _guarded(out, work)


def run_all(comm: Comm, inputs: list[str], output: str, aopts: AnalyzeOptions, sopts: SortOptions,
            popts: PackOptions, overwrite: bool, job: JobInfo, keep_intermediate: bool = False,
            progress: bool = False, store: StoreOptions | None = None) -> dict | None:
    """Analyze, sort and pack in one job (no intermediate files unless asked; ``store``: data shards too)."""
    comm.collectively(sopts.validate)
    comm.collectively(popts.validate)
    if popts.oversize == "split":
        comm.collectively(check_split, aopts.as_dict())
    store_fn = None
    if store is not None and store.enabled:
        store_fn = prepare(comm, store, aopts.as_dict(), popts, aopts.tokenizer)
    out = OutputDir(comm, output, overwrite, inputs)
    extra = []
    if keep_intermediate:
        extra = [OutputDir(comm, f"{output}.metrics", overwrite, inputs),
                 OutputDir(comm, f"{output}.sorted", overwrite, inputs)]
    # the measurements outlive a failure after analyze (an oversize sample, an error in sort or pack)
    kept = extra[0] if keep_intermediate else _kept_metrics(comm, out, overwrite, inputs)
    prof = Profile(comm)
    metrics_manifest: dict | None = None

    def work():
        nonlocal metrics_manifest
        sink = store_fn.token_cache(out) if store_fn is not None else None  # ids kept, not re-tokenized
        with prof.stage("analyze"):
            samples = analyze(comm, inputs, aopts, progress, token_sink=sink)
        prof.counts["analyze_rows"] = len(samples)
        measured = measured_options(aopts, samples)
        if keep_intermediate:
            # committed at once (the manifest is then rank 0's only)
            metrics_manifest = write_samples(comm, extra[0], "metrics", samples, measured, prof, job) or {}
        elif kept is not None:
            try:
                metrics_manifest = write_samples(comm, kept, "metrics", samples, measured, prof, job, commit=False)
            except SortpackError as exc:
                if not exc.collective:
                    raise
                kept.discard()  # insurance only: a full disk here does not stop the job
        fault_point(comm, "after_analyze")
        refuse_oversize(comm, samples, popts)  # fail fast: before the sort, not after it
        split = None
        if popts.oversize == "split":
            # before the sort: the pieces are sorted by their own sizes
            with prof.stage("split"):
                samples, split = split_oversize(comm, samples, popts)
        with prof.stage("sort"):
            ordered = sort_samples(comm, samples, sopts, rows_per_shard("sorted"), consume=True)
        del samples
        options = {**measured, **sopts.as_dict()}
        if keep_intermediate:
            write_samples(comm, extra[1], "sorted", ordered, options, prof, job)
        with prof.stage("pack"):
            mbs = pack_samples(comm, ordered, popts, sopts.key, split)
        files = ordered.files
        del ordered
        manifest = write_index(comm, out, mbs, {**options, **popts.as_dict()}, files, prof, job, store_fn)
        if kept is not None and not keep_intermediate:
            kept.discard()  # measured only to survive a failure
        return manifest

    try:
        return work()
    except BaseException as exc:
        where = None
        if metrics_manifest is not None and isinstance(exc, Exception):  # a signal or ^C: nothing stays
            where = str(kept.path) if keep_intermediate and kept is not None else _keep_on_failure(
                comm, kept, metrics_manifest, exc)
        # a collective error leaves every rank here: drop the half-written directories (the
        # measurements moved out of the output's temporary first)
        for o in [out, *extra]:
            o.discard()
        if where is None:
            raise
        hint = _repack_hint(where, output, sopts, popts, isinstance(exc, OversizeError))
        if isinstance(exc, SortpackError):
            cls = type(exc) if type(exc) in (SortpackError, OversizeError) else SortpackError
            raise cls(f"{exc}. {hint}", exc.collective) from None
        sys.stderr.write(f"sortpack: {hint}\n")
        raise
