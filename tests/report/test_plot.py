"""inspect --plot: the panels a person needs, drawn from directories the real pipeline wrote."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.format.manifest import read_manifest
from sortpack.format.shards import read_rows
from sortpack.parallel import SerialComm
from sortpack.pipeline.dataset import JobInfo, JobOutput, run_all
from sortpack.report.inspect import step_costs
from sortpack.report.plot import axes_titles, plot_directory, weighted_quantiles
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.pack import PackOptions
from sortpack.stages.plan_options import PlanOptions
from sortpack.stages.sort import SortOptions

from support import run_sortpack, write_text_parquet

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def plan(tmp_path):
    """An index (and its metrics) written by the pipeline: 3000 log-normal lengths, padded to 64."""
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(5, 1, 3000).astype(np.int64) + 1, 4000)
    path = write_text_parquet(tmp_path / "a.parquet", lengths, 500)
    out = tmp_path / "plan"
    run_all(SerialComm(), [str(path)],
            PlanOptions(AnalyzeOptions(column="text"), SortOptions(), PackOptions(max_tokens=8192, pad_to_multiple=64)),
            JobOutput(str(out), JobInfo(["test"]), keep_intermediate=True))
    return out, lengths


def index_columns(directory):
    m = read_manifest(directory)
    t = read_rows(directory, m, 0, m["num_rows"], ["num_samples", "batch_size", "padded_size", "tokens"])
    return {n: t.column(n).to_numpy().astype(np.int64) for n in t.column_names}


@pytest.mark.slow
def test_index_figure_has_every_panel_with_the_index_numbers(tmp_path, plan):
    out, lengths = plan
    png = tmp_path / "fig.png"
    fig = plot_directory(str(out), str(png), world_size=4, grad_accum=2)
    assert png.read_bytes()[:8] == PNG
    titles = axes_titles(fig)
    assert [t.split(" (")[0].split(";")[0] for t in titles] == [
        "sample sizes", "fill per micro-batch", "tokens per rank per step",
        "step imbalance: max / mean over 4 ranks", f"{titles[4].split(' ')[0]} distinct shapes",
        "LR scale, linear rule", "compute imbalance over 4 ranks"]
    c = index_columns(out)
    # the heat map is the reader's step layout of real tokens: ranks x steps
    heat = fig.axes[2].images[0].get_array()
    assert np.array_equal(np.asarray(heat), step_costs(c["tokens"], 4, 2).T)
    padded = c["batch_size"] * c["padded_size"]
    assert f"overall {100 * c['tokens'].sum() / padded.sum():.2f}%" in titles[1]
    shapes = {(b, p) for b, p in zip(c["batch_size"], c["padded_size"])}
    assert titles[4].startswith(f"{len(shapes):,} distinct shapes")
    step_samples = step_costs(c["num_samples"], 4, 2).sum(axis=1)
    assert f"median {float(np.median(step_samples)):g}" in titles[5]
    assert f"{len(lengths):,} samples" in titles[0]


@pytest.mark.slow
def test_world_size_defaults_to_one_rank_and_says_so(tmp_path, plan):
    out, _ = plan
    fig = plot_directory(str(out), str(tmp_path / "fig.png"))
    assert "--world-size" in axes_titles(fig)[2]
    assert fig.axes[2].images[0].get_array().shape[0] == 1


def test_metrics_and_sorted_directories_get_the_size_histogram_only(tmp_path, plan):
    out, lengths = plan
    for kind in ("metrics", "sorted"):
        png = tmp_path / f"{kind}.png"
        fig = plot_directory(f"{out}.{kind}", str(png))
        assert png.read_bytes()[:8] == PNG
        assert axes_titles(fig) == [f"sample sizes ({len(lengths):,} samples)"]
        legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        expected = [np.sort(lengths)[int(np.ceil(q * len(lengths))) - 1] for q in (0.5, 0.9, 0.99)]
        assert legend == [f"p{q} {v}" for q, v in zip((50, 90, 99), expected)]


def test_missing_matplotlib_is_one_clear_error(tmp_path, plan, monkeypatch):
    out, _ = plan
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(SortpackError, match=r"pip install 'sortpack\[plot\]'"):
        plot_directory(str(out), str(tmp_path / "fig.png"))
    assert not (tmp_path / "fig.png").exists()


@pytest.mark.slow
def test_cli_inspect_plot_writes_the_figure(tmp_path, plan):
    out, _ = plan
    png = tmp_path / "cli.png"
    run_sortpack(["inspect", out, "--world-size", "2", "--plot", png])
    assert png.read_bytes()[:8] == PNG


@given(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 5)), min_size=1, max_size=40),
       st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.99, 1.0]))
def test_weighted_quantiles_match_repeated_values(pairs, q):
    values = np.array([v for v, _ in pairs], np.int64)
    weights = np.array([w for _, w in pairs], np.float64)
    if weights.sum() == 0:
        weights[0] = 1
    repeated = np.repeat(values, weights.astype(np.int64))
    # the smallest value whose cumulative weight reaches q of the total
    expected = np.sort(repeated)[max(int(np.ceil(q * len(repeated))) - 1, 0)]
    assert weighted_quantiles(values, weights, [q])[0] == expected
