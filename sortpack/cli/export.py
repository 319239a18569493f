"""``sortpack export``: write a plan in another stack's format (Megatron ``.bin/.idx``, packed Parquet)."""
from __future__ import annotations

import click

from .group import cli
from .job import CommandOutput, job_command

_TARGETS = ("megatron", "packed-parquet")  # write.export.TARGETS (not imported here: --help loads no writer)


@cli.command()
@click.argument("plan", metavar="PLAN", type=click.Path(file_okay=False))
@click.option("--to", "to", required=True, type=click.Choice(_TARGETS),
              help="megatron: PREFIX.bin/.idx for megatron-core's IndexedDataset (one sequence per planned sample "
                   "in plan order, a micro-batch per document; labels as PREFIX_labels); packed-parquet: one row "
                   "per packed row of a --rows plan (input_ids, loss_mask, seq_start_id) for NeMo / "
                   "Megatron-Bridge.")
@click.option("-o", "--output", required=True, type=click.Path(),
              help="megatron: the PREFIX (PREFIX.idx works too); packed-parquet: the file (name it *.idx.parquet "
                   "for Megatron-Bridge). Written atomically.")
@click.option("--vocab-size", type=int, default=None,
              help="megatron: the tokens' dtype is the smallest holding ids below this (default: the plan's "
                   "largest id decides).")
@click.option("--overwrite", is_flag=True, help="Replace an existing export of the same kind.")
@click.option("--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--threads", type=int, default=1, show_default=True,
              help="Arrow threads per rank (0: Arrow's default, all cores).")
@job_command
def export(comm, job, out: CommandOutput, plan, **kw):
    """Write PLAN (an index directory) as files another training stack reads.

    The plan's token ids come from its stored data (--store-tokens, or a --store'd token-id
    column) or, for a plan over Megatron datasets, from their .bin. Runs under mpiexec:
    every rank writes its part (megatron); the bytes never depend on the rank count.
    """
    from ..write.export import ExportRequest, export_plan

    summary = export_plan(comm, ExportRequest(plan, kw["to"], out.path, out.overwrite, kw["vocab_size"]))
    if comm.is_root() and not out.quiet:
        what = (f"{summary['sequences']} sequences in {summary['documents']} documents, {summary['tokens']} tokens "
                f"as {summary['dtype']}" if kw["to"] == "megatron" else f"{summary['rows']} packed rows")
        click.echo(f"wrote {', '.join(summary['files'])}: {what}")
