"""The ``sortpack`` click group; each command file adds its command to it."""
from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sortpack")
def cli():
    """Sort variable-length datasets by size and pack them into token-budgeted micro-batches.

    Every command runs as one process or under mpiexec/srun with any number of ranks and
    writes byte-identical data either way.
    """
