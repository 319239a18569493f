"""``sortpack pack``: cut a sorted directory into micro-batches."""
from __future__ import annotations

import click

from .builders import make_holdout, make_pack, make_store
from .group import cli
from .job import CommandOutput, job_command
from .options import common_options, holdout_options, pack_options, store_options


@cli.command()
@click.argument("sorted_dir", metavar="SORTED", type=click.Path(file_okay=False))
@pack_options(required=True)
@store_options(tokenizer=True)
@holdout_options
@common_options
@job_command
def pack(comm, job, out: CommandOutput, sorted_dir, **kw):
    """Cut a sorted directory into micro-batches; write the index.

    With --holdout, the held-out plan in OUTPUT/holdout too: the same two plans as
    ``run --holdout`` with the same options (the choice depends on sample ids only).
    """
    from ..pipeline.dataset import run_pack

    kw["store_tokenizer"] = kw.pop("tokenizer")
    store = make_store(kw)
    return run_pack(comm, sorted_dir, out.path, make_pack(kw), out.overwrite, job, store, make_holdout(kw))
