"""inspect's compute cost: C*s + s^2 per document, dealt to ranks as the reader deals micro-batches."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from sortpack.report.inspect import DEFAULT_COST_COEFF, imbalance, inspect_directory, step_costs

from support import read_manifest, run_sortpack, write_text_parquet


def chat_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Return long-tail chat-like lengths: log-normal, median 600, clipped to 16..32768."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(600), 1.2, n)), 16, 32768).astype(np.int64)


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    sizes = chat_lengths(4000)
    pq_path = d / "chat.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"n": sizes}), pq_path)
    return d, sizes


def microbatches(directory) -> pa.Table:
    """Return every micro-batch row of an index directory."""
    m = read_manifest(directory)
    return pa.concat_tables([ipc.open_file(str(directory / s["file"])).read_all() for s in m["shards"]])


def oracle(table: pa.Table, sizes: np.ndarray, c: float, world: int, accum: int) -> dict:
    """Return the compute imbalance written plainly: per micro-batch C*tokens + sum of s^2, per step per rank."""
    cost = np.array([c * sizes[ids].sum() + (sizes[ids] ** 2).sum()
                     for ids in map(np.asarray, table.column("sample_ids").to_pylist())], dtype=np.float64)
    m = len(cost)
    width = world * accum
    steps = -(-m // width)
    flat = np.arange(steps * width) % m  # a short tail repeats micro-batches from the start
    per = cost[flat].reshape(steps, accum, world).sum(axis=1)
    ratio = per.max(axis=1) / per.mean(axis=1)
    return {"p50": np.quantile(ratio, 0.5), "p99": np.quantile(ratio, 0.99), "max": ratio.max(),
            "weighted": per.max(axis=1).sum() / per.mean(axis=1).sum()}


def test_inspect_reports_the_compute_imbalance_of_rows(chat, tmp_path):
    d, sizes = chat
    out = tmp_path / "rows"
    run_sortpack(["run", d / "chat.parquet", "-o", out, "--size", "column:n", "--rows", "32768"])
    proc = run_sortpack(["inspect", out, "--world-size", "8", "--grad-accum", "2", "--json", "--cost-coeff", "4096"])
    report = json.loads(proc.stdout)
    want = oracle(microbatches(out), sizes, 4096, 8, 2)
    assert report["cost_coeff"] == 4096
    assert set(report["compute_imbalance"]) == {"p50", "p99", "max", "weighted"}
    for k, v in want.items():
        assert report["compute_imbalance"][k] == pytest.approx(v, rel=1e-12)
    assert report["attention"] == int((sizes ** 2).sum())
    default = inspect_directory(str(out), 8, 2)
    assert default["cost_coeff"] == DEFAULT_COST_COEFF == 6144
    assert default["compute_imbalance"]["weighted"] == pytest.approx(oracle(microbatches(out), sizes, 6144, 8,
                                                                            2)["weighted"], rel=1e-12)


def test_a_padded_plan_costs_its_padded_shape(tmp_path):
    sizes = chat_lengths(600, seed=1)
    write_text_parquet(tmp_path / "a.parquet", np.minimum(sizes, 4000))
    out = tmp_path / "padded"
    run_sortpack(["run", tmp_path / "a.parquet", "-o", out, "--max-tokens", "16384"])
    t = microbatches(out)
    bs, ps = t.column("batch_size").to_numpy().astype(np.int64), t.column("padded_size").to_numpy()
    assert np.array_equal(t.column("attention").to_numpy(), bs * ps * ps)
    report = inspect_directory(str(out), 4, 1, cost_coeff=100.0)
    want = imbalance(step_costs(100.0 * bs * ps + bs * ps * ps, 4, 1))
    assert report["compute_imbalance"] == want


def test_imbalance_of_even_and_uneven_steps():
    even = np.full((5, 4), 7.0)
    assert imbalance(even) == {"p50": 1.0, "p99": 1.0, "max": 1.0, "weighted": 1.0}
    costs = np.array([[1.0, 1.0], [3.0, 1.0]])
    got = imbalance(costs)
    assert got["max"] == 1.5 and got["weighted"] == pytest.approx((1 + 3) / (1 + 2))


def test_cost_coeff_must_be_a_finite_number(chat, tmp_path):
    d, _ = chat
    out = tmp_path / "rows"
    run_sortpack(["run", d / "chat.parquet", "-o", out, "--size", "column:n", "--rows", "32768"])
    proc = run_sortpack(["inspect", out, "--world-size", "2", "--cost-coeff", "-1"], check=False)
    assert proc.returncode == 2 and "--cost-coeff -1" in proc.stderr


@pytest.mark.slow
def test_the_figure_has_a_compute_panel_with_the_report_s_figures(chat, tmp_path):
    pytest.importorskip("matplotlib")
    from sortpack.report.plot import axes_titles, plot_directory

    d, _ = chat
    out = tmp_path / "rows"
    run_sortpack(["run", d / "chat.parquet", "-o", out, "--size", "column:n", "--rows", "32768"])
    fig = plot_directory(str(out), str(tmp_path / "fig.png"), world_size=8, cost_coeff=1000.0)
    weighted = inspect_directory(str(out), 8, 1, 1000.0)["compute_imbalance"]["weighted"]
    assert axes_titles(fig)[6] == f"compute imbalance over 8 ranks (C=1000): weighted {weighted:.4f}"
