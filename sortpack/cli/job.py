"""How a stage command runs: on the job's communicator, with the error and exit-code rules."""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import click

from ..errors import SortpackError
from ..launcher import launcher_rank
from .printing import echo_err, fail, oversize_note, profile_table, summary_line
from .startup import set_threads, set_tokenizer_threads


def job_command(fn: Callable[..., dict | None]) -> Callable[..., None]:
    """Return the command that runs stage command ``fn`` on the job's communicator with the error and exit-code rules.

    ``fn(comm, job, **options)`` returns the manifest it wrote (printed as a summary on rank 0).
    """

    @functools.wraps(fn)
    def wrapper(**kw):
        from ..parallel import get_comm, run_guarded
        from ..progress import configure as configure_progress
        from ..write.provenance import JobInfo
        from ..write.termination import install as clean_up_on_sigterm

        clean_up_on_sigterm()
        threads = kw.pop("threads")
        if threads < 0:
            raise click.BadParameter("must be >= 0", param_hint="--threads")
        set_threads(threads)
        try:
            comm = get_comm()
        except SortpackError as exc:
            # no communicator to agree on who prints: the launcher's rank decides
            if launcher_rank() == 0:
                fail(exc)
            sys.exit(2)
        set_tokenizer_threads(comm.node_size())
        configure_progress(comm.is_root() and not kw["quiet"], comm.size)
        job = JobInfo(argv=["sortpack"] + sys.argv[1:])
        result = {}

        def body():
            result["manifest"] = fn(comm, job, **kw)

        code = run_guarded(comm, body, echo_err)
        if code:
            sys.exit(code)
        manifest = result.get("manifest")
        if comm.is_root() and manifest is not None and not kw["quiet"]:
            click.echo(summary_line(kw["output"], manifest))
            dropped = manifest.get("stats", {}).get("empty_dropped", 0)
            if dropped:
                click.echo(f"dropped {dropped} empty samples (no content; --keep-empty keeps them)")
            if kw.get("profile"):
                click.echo(profile_table(manifest["provenance"]["profile"], manifest["provenance"].get("exchange")))
        note = oversize_note(manifest) if comm.is_root() and manifest is not None else None
        if note and (not kw["quiet"] or note.startswith("sortpack: warning")):
            echo_err(note)

    return wrapper
