"""A second budget (``--size2 SPEC --max-size2 N``): text tokens and image patches, both capped and balanced."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from sortpack.report.inspect import imbalance, step_costs

from support import assert_same_at_ranks, read_manifest, run_sortpack

T, N = 32768, 16384  # the LLM's tokens and the vision encoder's patches per micro-batch


def vision_language(n: int, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """Return (text tokens, image patches) of n samples, weakly correlated (about 0.15).

    Text: log-normal, median 300, 16..4096; images: Poisson, more of them beside longer texts,
    each of 64, 144, 256 or 576 patches.
    """
    rng = np.random.default_rng(seed)
    text = np.clip(np.rint(rng.lognormal(np.log(300), 0.9, n)), 16, 4096).astype(np.int64)
    images = rng.poisson(np.clip(0.8 + 0.25 * np.log(text / 300), 0.05, None))
    return text, (images * rng.choice([64, 144, 256, 576], n)).astype(np.int64)


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    d = tmp_path_factory.mktemp("vl")
    text, patches = vision_language(6000)
    pq.write_table(pa.table({"text_tokens": text, "num_patches": patches}), d / "vl.parquet", row_group_size=1000)
    return d, text, patches


ARGS = ["--size", "column:text_tokens", "--size2", "column:num_patches", "--budget", "tokens",
        "--max-tokens", str(T), "--max-size2", str(N)]


def table(directory) -> pa.Table:
    """Return every micro-batch row of an index directory."""
    m = read_manifest(directory)
    return pa.concat_tables([ipc.open_file(str(directory / s["file"])).read_all() for s in m["shards"]])


@pytest.mark.slow
def test_both_caps_hold_fill_and_balance(vl, tmp_path):
    d, text, patches = vl
    out = tmp_path / "plan"
    run_sortpack(["run", d / "vl.parquet", "-o", out, *ARGS])
    t = table(out)
    ids = [np.asarray(x, np.int64) for x in t.column("sample_ids").to_pylist()]
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(len(text)))  # every sample once
    tok, size2 = t.column("tokens").to_numpy(), t.column("size2").to_numpy()
    assert np.array_equal(tok, [text[i].sum() for i in ids]) and np.array_equal(size2, [patches[i].sum() for i in ids])
    assert tok.max() <= T and size2.max() <= N  # every micro-batch under both caps
    binding = np.maximum(tok / T, size2 / N)
    assert binding.mean() >= 0.97
    for x in (tok, size2):  # both measures balanced over 8 ranks, any step
        assert imbalance(step_costs(x.astype(np.float64), 8, 1))["weighted"] <= 1.05
    report = json.loads(run_sortpack(["inspect", out, "--world-size", "8", "--json"]).stdout)
    assert report["cap_fills"]["binding"] == pytest.approx(binding.mean())
    assert report["cap_fills"]["max_tokens"] == pytest.approx((tok / T).mean())
    assert report["cap_fills"]["max_size2"] == pytest.approx((size2 / N).mean())
    assert report["size2_imbalance"]["weighted"] <= 1.05
    assert read_manifest(out)["options"]["max_size2"] == N


@pytest.mark.slow
def test_size_order_alone_leaves_the_second_measure_unbalanced(vl, tmp_path):
    # what the balanced order buys: the same caps in plain size order (--budget padded keeps it)
    d, text, patches = vl
    out = tmp_path / "plain"
    run_sortpack(["run", d / "vl.parquet", "-o", out, *ARGS[:-6], "--budget", "padded", "--max-tokens", str(T),
                  "--max-size2", str(N)])
    t = table(out)
    assert t.column("size2").to_numpy().max() <= N
    assert imbalance(step_costs(t.column("size2").to_numpy().astype(np.float64), 8, 1))["weighted"] > 1.1


@pytest.mark.slow
def test_a_sample_over_the_second_cap_alone_follows_oversize(tmp_path):
    text, patches = vision_language(300)
    patches[[5, 77]] = N + 1
    pq.write_table(pa.table({"text_tokens": text, "num_patches": patches}), tmp_path / "vl.parquet")
    proc = run_sortpack(["run", tmp_path / "vl.parquet", "-o", tmp_path / "e", *ARGS], check=False)
    assert proc.returncode == 2 and "2 samples have a second size over --max-size2 16384" in proc.stderr
    assert not (tmp_path / "e").exists()
    run_sortpack(["run", tmp_path / "vl.parquet", "-o", tmp_path / "s", *ARGS, "--oversize", "skip"])
    ids = np.concatenate([np.asarray(x) for x in table(tmp_path / "s").column("sample_ids").to_pylist()])
    assert 5 not in ids and 77 not in ids and len(ids) == 298
    assert read_manifest(tmp_path / "s")["stats"]["skipped"] == 2
    proc = run_sortpack(["run", tmp_path / "vl.parquet", "-o", tmp_path / "t", *ARGS, "--oversize", "truncate"],
                        check=False)
    assert proc.returncode == 2 and "cannot be cut" in proc.stderr


@pytest.mark.slow
def test_max_size2_needs_size2(vl, tmp_path):
    d, _, _ = vl
    proc = run_sortpack(["run", d / "vl.parquet", "-o", tmp_path / "p", "--size", "column:text_tokens",
                         "--max-tokens", str(T), "--max-size2", str(N)], check=False)
    assert proc.returncode == 2 and "--size2 SPEC" in proc.stderr


@pytest.mark.slow
def test_padded_budgets_cap_the_second_size_in_size_order(vl, tmp_path):
    d, text, patches = vl
    out = tmp_path / "padded"
    run_sortpack(["run", d / "vl.parquet", "-o", out, "--size", "column:text_tokens", "--size2",
                  "column:num_patches", "--max-tokens", "16384", "--max-size2", "4096", "--oversize", "skip"])
    t = table(out)
    assert t.column("size2").to_numpy().max() <= 4096
    bs, ps = t.column("batch_size").to_numpy(), t.column("padded_size").to_numpy()
    assert (bs.astype(np.int64) * ps).max() <= 16384
    assert np.all(np.diff(t.column("max_key").to_numpy()) >= 0)  # size order kept


@pytest.mark.slow
def test_a_two_cap_plan_is_the_same_at_any_rank_count(vl, tmp_path):
    d, _, _ = vl
    assert_same_at_ranks(["run", d / "vl.parquet", *ARGS, "--segment-size", "1500"], tmp_path)


@pytest.mark.slow
def test_rows_cap_the_second_size_per_row(vl, tmp_path):
    d, text, patches = vl
    out = tmp_path / "rows"
    run_sortpack(["run", d / "vl.parquet", "-o", out, "--size", "column:text_tokens", "--size2",
                  "column:num_patches", "--rows", "8192", "--rows-per-microbatch", "2", "--max-size2", "4096",
                  "--oversize", "skip"])
    t = table(out)
    per_row = []
    for ids, splits in zip(t.column("sample_ids").to_pylist(), t.column("row_splits").to_pylist()):
        ids = np.asarray(ids)
        for a, b in zip(splits[:-1], splits[1:]):
            per_row.append((text[ids[a:b]].sum(), patches[ids[a:b]].sum()))
    rows = np.asarray(per_row)
    assert rows[:, 0].max() <= 8192 and rows[:, 1].max() <= 4096
    assert np.maximum(rows[:, 0] / 8192, rows[:, 1] / 4096).mean() >= 0.9  # next-fit rows of large samples
