"""--balance compute: micro-batches ordered so that any W x A deal of a step costs alike on every rank."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from sortpack.report.inspect import imbalance, inspect_directory, step_costs

from support import assert_same_at_ranks, read_manifest, run_sortpack

ROW = 32768
C = 6144


def chat_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Return long-tail chat-like lengths: log-normal, median 600, sigma 1.2, clipped to 16..32768."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(600), 1.2, n)), 16, ROW).astype(np.int64)


def write(path, n: int, seed: int = 0) -> np.ndarray:
    """Write n chat-like lengths as the column ``n``; return them."""
    sizes = chat_lengths(n, seed)
    pq.write_table(pa.table({"n": sizes}), path, row_group_size=65536)
    return sizes


def table(directory) -> pa.Table:
    """Return every micro-batch row of an index directory."""
    m = read_manifest(directory)
    return pa.concat_tables([ipc.open_file(str(directory / s["file"])).read_all() for s in m["shards"]])


def compute(t: pa.Table, sizes: np.ndarray) -> np.ndarray:
    """Return each micro-batch's C*s + s^2 summed over its documents, from the sample ids (the oracle)."""
    ids = t.column("sample_ids").to_pylist()
    s = sizes.astype(np.float64)
    w = C * s + s * s
    return np.array([w[np.asarray(x)].sum() for x in ids])


def is_circle(cost: np.ndarray) -> bool:
    """Return whether ``cost`` is a circle of its sorted values: every other one ascending, then the rest descending."""
    ranked = np.sort(cost)
    return bool(np.allclose(cost, np.concatenate((ranked[0::2], ranked[1::2][::-1])), rtol=1e-12))


@pytest.mark.slow
def test_rows_of_a_million_chat_samples_are_balanced_at_64_ranks(tmp_path):
    sizes = write(tmp_path / "chat.parquet", 1_000_000)
    out = tmp_path / "balanced"
    run_sortpack(["run", tmp_path / "chat.parquet", "-o", out, "--size", "column:n", "--rows", str(ROW),
                  "--balance", "compute"], timeout=600)
    t = table(out)
    ids = np.concatenate([np.asarray(x) for x in t.column("sample_ids").to_pylist()])
    assert np.array_equal(np.sort(ids), np.arange(len(sizes)))  # every sample once
    fill = t.column("tokens").to_numpy().sum() / (t.column("batch_size").to_numpy().sum() * ROW)
    assert fill >= 0.999
    cost = compute(t, sizes)
    got = imbalance(step_costs(cost, 64, 1))
    assert got["weighted"] <= 1.01 and got["p99"] <= 1.05
    assert inspect_directory(str(out), 64, 1)["compute_imbalance"] == pytest.approx(got)
    # the plan never depends on W or A; a step spans twice its width of the sorted order (the circle)
    for w, a, most in ((8, 1, 1.01), (8, 4, 1.01), (16, 2, 1.01), (128, 1, 1.015)):
        assert imbalance(step_costs(cost, w, a))["weighted"] <= most, (w, a)
    default = tmp_path / "default"
    run_sortpack(["run", tmp_path / "chat.parquet", "-o", default, "--size", "column:n", "--rows", str(ROW)],
                 timeout=600)
    assert imbalance(step_costs(compute(table(default), sizes), 64, 1))["weighted"] > 1.05


def test_balance_orders_micro_batches_by_cost_within_a_stage(tmp_path):
    sizes = write(tmp_path / "chat.parquet", 20000, seed=1)
    out = tmp_path / "plan"
    run_sortpack(["run", tmp_path / "chat.parquet", "-o", out, "--size", "column:n", "--rows", "8192",
                  "--oversize", "skip", "--balance", "compute", "--cost-coeff", "1024", "--stages", "2",
                  "--key", "difficulty"])
    t = table(out)
    s = sizes.astype(np.float64)
    w = 1024 * s + s * s
    cost = np.array([w[np.asarray(x)].sum() for x in t.column("sample_ids").to_pylist()])
    stage = t.column("stage").to_numpy()
    assert np.all(np.diff(stage) >= 0)  # curriculum stages stay in order
    for k in np.unique(stage):
        assert is_circle(cost[stage == k])
    options = read_manifest(out)["options"]
    assert options["balance"] == "compute" and options["cost_coeff"] == 1024


@pytest.mark.slow
def test_balance_applies_to_greedy_plans_too(tmp_path):
    sizes = write(tmp_path / "chat.parquet", 20000, seed=2)
    out = tmp_path / "plan"
    run_sortpack(["run", tmp_path / "chat.parquet", "-o", out, "--size", "column:n", "--budget", "tokens",
                  "--max-tokens", "65536", "--balance", "compute"], ranks=2)
    t = table(out)
    ids = np.concatenate([np.asarray(x) for x in t.column("sample_ids").to_pylist()])
    assert np.array_equal(np.sort(ids), np.arange(len(sizes)))
    assert t.column("tokens").to_numpy().max() <= 65536
    assert is_circle(compute(t, sizes))


def test_an_unknown_balance_is_one_line(tmp_path):
    write(tmp_path / "chat.parquet", 100)
    proc = run_sortpack(["run", tmp_path / "chat.parquet", "-o", tmp_path / "p", "--size", "column:n", "--rows",
                         str(ROW), "--balance", "flops"], check=False)
    assert proc.returncode == 2 and "--balance 'flops': expected none, compute" in proc.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_a_balanced_plan_is_the_same_at_any_rank_count(tmp_path):
    write(tmp_path / "chat.parquet", 140000, seed=3)
    outs = assert_same_at_ranks(["run", tmp_path / "chat.parquet", "--size", "column:n", "--rows", str(ROW),
                                 "--balance", "compute"], tmp_path, timeout=300)
    report = json.loads(run_sortpack(["inspect", outs[0], "--world-size", "8", "--json"]).stdout)
    assert report["compute_imbalance"]["weighted"] <= 1.01


def test_a_mixture_refuses_balance(tmp_path):
    for name in ("web", "code"):
        (tmp_path / name).mkdir()
        write(tmp_path / name / "part.parquet", 200)
    proc = run_sortpack(["run", "--blend", f"1 {tmp_path / 'web'} 1 {tmp_path / 'code'}", "--size", "column:n",
                         "--max-tokens", "65536", "--balance", "compute", "-o", tmp_path / "p"], check=False)
    assert proc.returncode == 2 and "does not apply to a mixture" in proc.stderr


def test_a_padded_plan_balances_its_padded_compute(tmp_path):
    write(tmp_path / "chat.parquet", 30000, seed=5)
    common = ["run", tmp_path / "chat.parquet", "--size", "column:n", "--max-tokens", "65536"]
    run_sortpack([*common, "-o", tmp_path / "plain"])
    run_sortpack([*common, "-o", tmp_path / "balanced", "--balance", "compute"])
    t = table(tmp_path / "balanced")
    bs, ps = t.column("batch_size").to_numpy().astype(np.float64), t.column("padded_size").to_numpy()
    assert is_circle(bs * ps * (C + ps))  # ordered by the padded cost inspect reports
    before = inspect_directory(str(tmp_path / "plain"), 64, 1)["compute_imbalance"]["weighted"]
    after = inspect_directory(str(tmp_path / "balanced"), 64, 1)["compute_imbalance"]["weighted"]
    assert after < before


def test_the_short_last_step_joins_micro_batches_of_like_cost(tmp_path):
    # the reader fills a short last step from the plan's start: sorted plainly, at W = 64 the last step of this
    # plan would join its 7 costliest rows with the 57 cheapest (max/mean 2.0); laid out as a circle, the plan
    # ends where it starts
    sizes = write(tmp_path / "chat.parquet", 19640, seed=1)
    out = tmp_path / "plan"
    run_sortpack(["run", tmp_path / "chat.parquet", "-o", out, "--size", "column:n", "--rows", "8192",
                  "--oversize", "skip", "--balance", "compute"])
    cost = compute(table(out), sizes)
    assert len(cost) % 64 == 7
    last = step_costs(cost, 64, 1)[-1]
    assert last.max() / last.mean() < 1.1
    assert is_circle(cost)
