"""The commands as library calls: which stage runs, which directory it reads and writes.

``run_analyze``, ``run_sort``, ``run_pack`` and ``run_all`` are what the CLI calls; each
is collective (every rank calls it) and returns the written manifest on rank 0. This
module only orchestrates: the stages are analyze.py, sort.py and pack/; metrics and
sorted directories are read and written by sample_dirs.py, the index by index_writer.py;
rows move between ranks in distribute.py; provenance.py times the stages.
"""
from __future__ import annotations

from ..format.kinds import rows_per_shard
from ..format.manifest import read_manifest
from ..inputs.fingerprints import with_mtimes
from ..parallel import Comm
from ..stages.analyze import AnalyzeOptions, analyze, measured_options
from ..stages.pack import OversizeError, PackOptions, pack_samples
from ..stages.sort import SortOptions, sort_samples
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


def _keep_hint(output: str, kept: bool) -> str:
    """Return how to reuse a failed run's measurements with other pack options."""
    if kept:
        return (f"The measured samples are kept in {output}.sorted: `sortpack pack {output}.sorted -o {output} "
                f"...` repacks them without measuring again")
    return ("To measure once and try pack options, run with --keep-intermediate (OUTPUT.sorted is kept when "
            "packing fails) or run analyze and sort once, then `sortpack pack SORTED`")


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
    if store is not None and store.enabled:
        # the inputs are found through the sorted (or metrics) manifest's source fingerprint
        recorded = comm.collectively(read_manifest, sorted_dir, "sorted")["options"]
        store_fn = prepare(comm, store, recorded, popts, None)
    out = OutputDir(comm, output, overwrite, [sorted_dir])
    prof = Profile(comm)

    def work():
        with prof.stage("read"):
            samples, manifest = read_samples(comm, sorted_dir, "sorted")
        key = manifest["options"].get("key", "size")
        with prof.stage("pack"):
            mbs = pack_samples(comm, samples, popts, key)
        options = {**manifest["options"], **popts.as_dict()}
        return write_index(comm, out, mbs, options, with_mtimes(manifest), prof, job, store_fn)

    return _guarded(out, work)


def run_all(comm: Comm, inputs: list[str], output: str, aopts: AnalyzeOptions, sopts: SortOptions,
            popts: PackOptions, overwrite: bool, job: JobInfo, keep_intermediate: bool = False,
            progress: bool = False, store: StoreOptions | None = None) -> dict | None:
    """Analyze, sort and pack in one job (no intermediate files unless asked; ``store``: data shards too)."""
    comm.collectively(sopts.validate)
    comm.collectively(popts.validate)
    store_fn = None
    if store is not None and store.enabled:
        store_fn = prepare(comm, store, aopts.as_dict(), popts, aopts.tokenizer)
    out = OutputDir(comm, output, overwrite, inputs)
    extra = []
    if keep_intermediate:
        extra = [OutputDir(comm, f"{output}.metrics", overwrite, inputs),
                 OutputDir(comm, f"{output}.sorted", overwrite, inputs)]
    prof = Profile(comm)

    def work():
        sink = store_fn.token_cache(out) if store_fn is not None else None  # ids kept, not re-tokenized
        with prof.stage("analyze"):
            samples = analyze(comm, inputs, aopts, progress, token_sink=sink)
        prof.counts["analyze_rows"] = len(samples)
        measured = measured_options(aopts, samples)
        if keep_intermediate:
            write_samples(comm, extra[0], "metrics", samples, measured, prof, job)
        with prof.stage("sort"):
            ordered = sort_samples(comm, samples, sopts, rows_per_shard("sorted"), consume=True)
        del samples
        options = {**measured, **sopts.as_dict()}
        if keep_intermediate:
            write_samples(comm, extra[1], "sorted", ordered, options, prof, job)
        with prof.stage("pack"):
            try:
                mbs = pack_samples(comm, ordered, popts, sopts.key)
            except OversizeError as exc:
                raise OversizeError(f"{exc}. {_keep_hint(output, keep_intermediate)}", exc.collective) from None
        files = ordered.files
        del ordered
        return write_index(comm, out, mbs, {**options, **popts.as_dict()}, files, prof, job, store_fn)

    return _guarded([out, *extra], work)
