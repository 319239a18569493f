"""``sortpack verify``: re-check a directory's shards and manifest."""
from __future__ import annotations

import sys

import click

from ..errors import SortpackError
from ..launcher import launcher_rank
from .group import cli
from .printing import fail


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False))
def verify(directory):
    """Re-check every shard's sha256 and the manifest; exit 1 on any mismatch."""
    if launcher_rank() != 0:
        return  # under mpiexec/srun one rank checks for all: the shards are read once
    from ..format.shards import verify_directory

    try:
        problems = verify_directory(directory)
    except SortpackError as exc:
        fail(exc)
    if problems:
        for p in problems:
            click.echo(f"{directory}: {p}", err=True)
        sys.exit(1)
    click.echo(f"{directory}: ok")
