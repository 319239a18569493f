"""``sortpack inspect``: report on a directory, or trace a plan's steps and samples."""
from __future__ import annotations

import json
import os

import click

from ..errors import SortpackError
from .group import cli
from .job import on_one_rank


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--world-size", type=int, default=None, help="Data-parallel ranks: report steps and step imbalance.")
@click.option("--grad-accum", type=int, default=1, show_default=True, help="Micro-batches per rank per step.")
@click.option("--cost-coeff", type=float, default=None, metavar="C",
              help="With --world-size: C of the compute cost C*s + s^2 per document (compute_imbalance); "
                   "default 6144, C ~ 6 * d_model (docs/step-costs.md).")
@click.option("--lr-method", type=click.Choice(["linear", "sqrt", "none"]), default="none", show_default=True,
              help="How the training scales its LR by each step's batch (VariableBatchSizeLR's method): warn of "
                   "steps whose LR scale is over 4x the median step's.")
@click.option("--lr-by", type=click.Choice(["samples", "tokens"]), default="samples", show_default=True,
              help="With --lr-method: what the step's batch counts (VariableBatchSizeLR's by).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG: sizes, fill, step balance, shapes, LR scale.")
@click.option("--step", type=int, default=None,
              help="List each rank's micro-batches of this run step (epoch * steps_per_epoch + step) with their "
                   "sample ids.")
@click.option("--sample", "samples", type=int, multiple=True,
              help="List the steps and ranks where this sample id comes (repeatable).")
@click.option("--order", type=click.Choice(["index", "shuffle", "curriculum"]), default="index", show_default=True,
              help="With --step/--sample: the sampler's order.")
@click.option("--seed", type=int, default=0, show_default=True, help="With --step/--sample: the sampler's seed.")
@click.option("--epoch", type=int, default=None,
              help="With --step: count the step within this epoch; with --sample: the epoch to search (default 0).")
@click.option("--drop-last", is_flag=True, help="With --step/--sample: the sampler's drop_last.")
@click.option("--largest-first", is_flag=True, help="With --step/--sample: the sampler's largest_first.")
@click.option("--warmup-shapes", is_flag=True, help="With --step/--sample: the sampler's warmup_shapes.")
def inspect(directory, as_json, plot, step, samples, **kw):
    """Report on a metrics, sorted or index directory; --step/--sample trace a plan's steps."""
    from ..reader.plan import StepOrder
    from ..reader.sampler_state import Layout

    # under mpiexec/srun rank 0 reports (and plots) for all; every rank exits with its status
    world_size, grad_accum = kw.pop("world_size"), kw.pop("grad_accum")
    cost_coeff, epoch = kw.pop("cost_coeff"), kw.pop("epoch")  # the rest: the sampler's order (StepOrder)
    lr = (kw.pop("lr_method"), kw.pop("lr_by"))
    if step is not None or samples:
        layout, how = Layout(1 if world_size is None else world_size, grad_accum), StepOrder(**kw)
        text, root = on_one_rank(lambda: _trace(directory, (step, samples, epoch), layout, how, as_json))
    else:
        text, root = on_one_rank(lambda: _report(directory, Layout(world_size, grad_accum), (cost_coeff, lr),
                                                 as_json, plot))
    if root:
        click.echo(text)


def _report(directory, layout, costs, as_json, plot) -> str:
    """Return the report (text or JSON) of ``directory``; with ``plot``, its figure written there too.

    ``costs``: ``--cost-coeff`` and the LR rule (``--lr-method``, ``--lr-by``).
    """
    from ..report.inspect import DEFAULT_COST_COEFF, inspect_directory, render
    from ..report.plot import plot_directory

    world_size, grad_accum = layout
    cost_coeff, (method, by) = costs
    if cost_coeff is None:
        cost_coeff = DEFAULT_COST_COEFF
    elif not (cost_coeff >= 0 and cost_coeff < float("inf")):
        raise SortpackError(f"--cost-coeff {cost_coeff}: must be a finite number >= 0")
    rule = None if method == "none" else (method, by)
    report = inspect_directory(directory, world_size, grad_accum, cost_coeff, rule)
    if plot:
        os.makedirs(os.path.dirname(os.path.abspath(plot)), exist_ok=True)
        plot_directory(directory, plot, world_size, grad_accum, cost_coeff)
    for warning in report.get("warnings", []):  # on stderr: the report itself stays parseable
        click.echo(f"sortpack: warning: {warning}", err=True)
    return json.dumps(report, indent=1) if as_json else render(report)


def _trace(directory, asked: tuple[int | None, tuple[int, ...], int | None], layout, how, as_json) -> str:
    """Return the trace (text or JSON) of ``asked``, ``(step, sample ids, epoch)``: one step's or the samples'."""
    from ..reader.trace import render_trace, sample_trace, step_trace

    step, samples, epoch = asked
    if step is not None and samples:
        raise SortpackError("--step and --sample: give one of them")
    if step is not None:
        trace = step_trace(directory, step, layout, how, epoch)
    else:
        trace = sample_trace(directory, samples, layout, how, epoch or 0)
    return json.dumps(trace, indent=1) if as_json else render_trace(trace)
