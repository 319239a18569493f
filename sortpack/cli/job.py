"""How a stage command runs: on the job's communicator, with the error and exit-code rules."""
from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import click

from ..errors import SortpackError, one_line
from ..launcher import printing_rank
from .printing import echo_err, fail, holdout_note, oversize_note, profile_table, summary_line
from .startup import resume_gc, set_threads, set_tokenizer_threads


class CommandOutput(NamedTuple):
    """Where a stage command writes (``-o``, ``--overwrite``) and what it prints (``--quiet``, ``--profile``)."""

    path: str
    overwrite: bool = False
    quiet: bool = False
    profile: bool = False


def prints_alone() -> bool:
    """Return whether this process prints an error found before there is a communicator to agree on who prints.

    The launcher's rank 0 does (by its first well-formed variables when some are wrong).
    """
    return printing_rank() == 0


def prints_usage_errors() -> bool:
    """Return whether this process prints a usage error: the communicator's rank 0 (the launcher's without MPI).

    The communicator, not the launcher's variables: a process that inherited another job's
    variables is rank 0 of its own job and must say what is wrong.
    """
    from ..parallel import get_comm

    try:
        return get_comm().is_root()
    except SortpackError:
        return prints_alone()


def _job_comm():
    """Return the job's communicator; a launcher variable that does not parse exits 2 (printed by one process)."""
    from ..parallel import get_comm

    try:
        return get_comm()
    except SortpackError as exc:
        if prints_alone():
            fail(exc)
        sys.exit(2)


def on_one_rank(fn: Callable[[], Any]) -> tuple[Any, bool]:
    """Return (``fn()``'s result, whether this is rank 0) on every rank of the job, ``fn`` run on rank 0 only.

    For the commands that read a directory once for the whole job (``inspect``, ``verify``):
    rank 0 is the communicator's, never a launcher variable's (a leaked launcher rank once
    made ``verify`` exit 0 unchecked), and every rank's exit status carries the verdict. A
    ``SortpackError`` of ``fn`` is printed once (rank 0) and every rank exits 2; any other
    failure aborts the job.
    """
    comm = _job_comm()
    resume_gc()  # what loaded the libraries is frozen: the command's own objects are collected
    outcome: tuple[str, Any] = ("ok", None)
    if comm.is_root():
        try:
            outcome = ("ok", fn())
        except SortpackError as exc:
            outcome = ("error", one_line(exc))
        except BaseException:
            if comm.size > 1:
                traceback.print_exc()
                sys.stderr.write("sortpack: rank 0 failed; aborting all ranks\n")
                comm.abort(1)
            raise
    if comm.size > 1:
        outcome = comm.bcast_obj(outcome)
    if outcome[0] == "error":
        if comm.is_root():
            echo_err(f"Error: {outcome[1]}")
        sys.exit(2)
    return outcome[1], comm.is_root()


def job_command(fn: Callable[..., dict | None]) -> Callable[..., None]:
    """Return the command that runs stage command ``fn`` on the job's communicator with the error and exit-code rules.

    ``fn(comm, job, out, **options)`` (``out`` a ``CommandOutput``) returns the manifest it wrote
    (printed as a summary on rank 0).
    """

    @functools.wraps(fn)
    def wrapper(**kw):
        from ..parallel import run_guarded
        from ..progress import configure as configure_progress
        from ..write.provenance import JobInfo
        from ..write.termination import install as clean_up_on_sigterm
        from ..write.termination import set_rank

        clean_up_on_sigterm()
        threads = kw.pop("threads")
        if threads < 0:
            raise click.BadParameter("must be >= 0", param_hint="--threads")
        set_threads(threads)
        comm = _job_comm()
        set_rank(comm.rank)  # rank 0 prints the line of a signal that finds nothing to remove
        set_tokenizer_threads(comm.node_size())
        out = CommandOutput(kw.pop("output"), kw.pop("overwrite"), kw.pop("quiet"), kw.pop("profile", False))
        configure_progress(comm.is_root() and not out.quiet, comm.size)
        job = JobInfo(argv=["sortpack"] + sys.argv[1:])
        result = {}

        def body():
            result["manifest"] = fn(comm, job, out, **kw)

        resume_gc()  # what loaded the libraries is frozen: the job's own objects are collected
        code = run_guarded(comm, body, echo_err)
        if code:
            sys.exit(code)
        manifest = result.get("manifest")
        if comm.is_root() and manifest is not None and not out.quiet:
            click.echo(summary_line(out.path, manifest))
            dropped = manifest.get("stats", {}).get("empty_dropped", 0)
            if dropped:
                click.echo(f"dropped {dropped} empty samples (no content; --keep-empty keeps them)")
            if out.profile:
                click.echo(profile_table(manifest["provenance"]["profile"], manifest["provenance"].get("exchange")))
        notes = [oversize_note(manifest), holdout_note(manifest)] if comm.is_root() and manifest is not None else []
        for note in notes:
            if note and (not out.quiet or note.startswith("sortpack: warning")):
                echo_err(note)

    return wrapper
