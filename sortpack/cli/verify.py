"""``sortpack verify``: re-check a directory's shards and manifest."""
from __future__ import annotations

import sys

import click

from .group import cli
from .job import on_one_rank


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False))
def verify(directory):
    """Re-check every shard's sha256 and the manifest; exit 1 on any mismatch."""
    from ..format.shards import verify_directory

    # under mpiexec/srun rank 0 checks for all (the shards are read once); every rank exits with its verdict
    problems, root = on_one_rank(lambda: verify_directory(directory))
    if root:
        for p in problems:
            click.echo(f"{directory}: {p}", err=True)
    if problems:
        sys.exit(1)
    if root:
        click.echo(f"{directory}: ok")
