"""``sortpack run``: analyze, sort and pack in one job, from inputs or a mixture."""
from __future__ import annotations

import click

from .builders import make_analyze, make_holdout, make_mixture, make_pack, make_sort, make_store
from .group import cli
from .job import CommandOutput, job_command
from .options import (
    analyze_options,
    common_options,
    holdout_options,
    mixture_options,
    pack_options,
    sort_options,
    store_options,
)


@cli.command()
@click.argument("inputs", nargs=-1)
@analyze_options
@sort_options
@pack_options(required=True)
@click.option("--keep-intermediate", is_flag=True, help="Also write OUTPUT.metrics and OUTPUT.sorted.")
@store_options(tokenizer=False)
@mixture_options
@holdout_options
@common_options
@job_command
def run(comm, job, out: CommandOutput, inputs, keep_intermediate, **kw):
    """Analyze, sort and pack in one job; write the index.

    INPUTS are as for analyze: files, directories, globs, Hugging Face save_to_disk
    directories (a DatasetDict with --split). With --mixture MIX.json or --blend, the
    sources come from there instead: one plan over weighted sources (docs/mixtures.md).
    With --holdout, a seeded set of each source's samples becomes a plan of its own in
    OUTPUT/holdout, never in the training plan.
    """
    from ..pipeline.dataset import run_all

    mix = make_mixture(inputs, kw, keep_intermediate)
    store = make_store(kw)
    holdout = make_holdout(kw, mixture=mix is not None)
    if mix is not None:
        from ..pipeline.mixture import run_mixture

        return run_mixture(comm, mix, out.path, make_analyze(kw), make_sort(kw), make_pack(kw), out.overwrite, job,
                           progress=not out.quiet, store=store, holdout=holdout)
    return run_all(comm, list(inputs), out.path, make_analyze(kw), make_sort(kw), make_pack(kw), out.overwrite,
                   job, keep_intermediate, progress=not out.quiet, store=store, holdout=holdout)
