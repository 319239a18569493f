"""Where ``run`` keeps its measurements: OUTPUT.metrics and .sorted with ``--keep-intermediate``, else a dump
that becomes OUTPUT.metrics only when the job fails after analyze (so a failed pack need not measure again).
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ..env import env_flag
from ..errors import SortpackError
from ..parallel import Comm
from ..stages.pack import OversizeError, PackOptions
from ..stages.plan_options import PlanOptions
from ..stages.samples import SampleColumns
from ..stages.sort import SortOptions
from ..write.kept import Dumped, dump_samples, keep_alone, keep_together
from ..write.output import OutputDir
from ..write.plan_record import PlanRecord
from ..write.provenance import JobInfo, Profile
from .job import JobScope

__all__ = ["Measurements"]


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


def _kept_by_a_run(path: Path) -> bool:
    """Return whether ``path`` is a metrics directory that a ``sortpack run`` wrote (measurements it kept), and only
    that: a user's own ``analyze -o OUTPUT.metrics`` is no run's, and a directory holding anything else is no
    sortpack output."""
    from ..write.output_guard import is_sortpack_output

    try:
        manifest = json.loads((path / "manifest.json").read_text())
        argv = manifest.get("provenance", {}).get("argv") or []
    except (OSError, ValueError, AttributeError):
        return False
    return manifest.get("format") == "sortpack-metrics" and argv[1:2] == ["run"] and is_sortpack_output(path) is None


def stale_note(output: str, overwrite: bool) -> str | None:
    """Return the line a ``run`` that succeeded prints about an OUTPUT.metrics an earlier run into OUTPUT kept (None:
    there is none), which no longer goes with OUTPUT: removed under ``overwrite``, named otherwise."""
    metrics = Path(f"{output}.metrics")
    if not metrics.is_dir() or not _kept_by_a_run(metrics):
        return None
    if not overwrite:
        return (f"sortpack: {metrics} holds the measurements an earlier run into {output} kept, not this plan's; "
                "remove it (or give --overwrite, which removes it)")
    shutil.rmtree(metrics)
    return f"sortpack: removed {metrics}, the measurements an earlier run into {output} kept (stale now)"


class Measurements:
    """Where ``run`` keeps its measurements: OUTPUT.metrics and .sorted with --keep-intermediate, else a raw
    dump inside the output's temporary that becomes OUTPUT.metrics only when the job fails after analyze."""

    def __init__(self, scope: JobScope, output: str, overwrite: bool, inputs: list[str], keep_intermediate: bool):
        comm = scope.out.comm
        self.comm = comm
        self.output, self.overwrite = output, overwrite
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
            from ..write.sample_dirs import write_samples  # --keep-intermediate only

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
            from ..write.sample_dirs import write_samples  # --keep-intermediate only

            write_samples(self.comm, self.extra[1], "sorted", ordered, PlanRecord(options, ordered.files, prof, job))

    def done(self) -> None:
        """Drop the dump kept only to survive a failure: the job succeeded; so did the measurements an earlier run
        into the same output kept (``stale_note``)."""
        if self.keep_intermediate:
            return
        if self.kept is not None:
            self.kept.discard()
        if self.comm.is_root():
            note = stale_note(self.output, self.overwrite)
            if note is not None:
                print(note, file=sys.stderr, flush=True)

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
