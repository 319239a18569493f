"""``sortpack analyze``: measure every sample's size and difficulty."""
from __future__ import annotations

import click

from .builders import make_analyze
from .group import cli
from .job import CommandOutput, job_command
from .options import analyze_options, common_options


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@analyze_options
@common_options
@job_command
def analyze(comm, job, out: CommandOutput, inputs, **kw):
    """Measure every sample's size and difficulty; write a metrics directory.

    INPUTS are Parquet, Arrow, JSONL or CSV files, directories and globs, Hugging Face
    save_to_disk directories (a DatasetDict with --split) and to_parquet files.
    """
    from ..pipeline.dataset import run_analyze

    return run_analyze(comm, list(inputs), out.path, make_analyze(kw), out.overwrite, job, progress=not out.quiet)
