"""``sortpack sort``: sort a metrics directory by (key, sample_id)."""
from __future__ import annotations

import click

from .builders import make_sort
from .group import cli
from .job import CommandOutput, job_command
from .options import common_options, sort_options


@cli.command()
@click.argument("metrics", type=click.Path(file_okay=False))
@sort_options
@common_options
@job_command
def sort(comm, job, out: CommandOutput, metrics, **kw):
    """Sort a metrics directory by (key, sample_id); write a sorted directory."""
    from ..pipeline.dataset import run_sort

    return run_sort(comm, metrics, out.path, make_sort(kw), out.overwrite, job)
