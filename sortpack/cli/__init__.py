"""The ``sortpack`` command line: parse options, call the library, print results.

``startup`` (imported first: thread defaults before numpy loads BLAS), the ``group`` with
one file per command (each loaded when its command runs), the shared ``options`` and the
``builders`` of the library's option objects, ``job`` (how a stage command runs on the
communicator) and ``printing``.
"""
from __future__ import annotations

from . import startup  # isort: split

import sys

import click

from ..errors import one_line
from ..write import termination
from .group import cli
from .job import prints_usage_errors
from .printing import echo_err


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``sortpack`` console script."""
    # before the imports of a job's start-up: a Ctrl-C there is one line too, not a traceback per rank
    termination.install()
    if argv is None:  # this process's own command line (not a call from Python): before numpy's first array
        startup.pause_gc()  # until the job starts (cli.job)
        startup.keep_freed_memory()
        startup.skip_memory_hooks()  # before MPI loads
    startup.skip_pandas(argv)
    try:
        cli.main(args=argv, prog_name="sortpack", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        # one line, printed once: under mpiexec every rank parses the same arguments
        if prints_usage_errors():
            ctx_cmd = getattr(getattr(exc, "ctx", None), "command_path", "sortpack")
            echo_err(f"Error: {ctx_cmd}: {one_line(exc.format_message())}")
        sys.exit(exc.exit_code)
