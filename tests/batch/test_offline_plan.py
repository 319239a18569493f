"""One pack algorithm, two doors: ``plan_batch`` makes the micro-batches the offline pipeline makes for the same
lengths and options (``sortpack run --size column:n --rows MAX_TOKENS``), run here as a real job."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack import plan_batch
from sortpack.reader import PackedIndex

from support import run_sortpack


def rollout_lengths(n: int, seed: int = 0, top: int = 8192) -> np.ndarray:
    """Return n rollout-like lengths: a log-normal prompt (median 400) plus a log-normal response (median 1,500)."""
    rng = np.random.default_rng(seed)
    prompt, response = rng.lognormal(np.log(400), 0.6, n), rng.lognormal(np.log(1500), 1.0, n)
    return np.clip(np.rint(prompt + response), 1, top).astype(np.int64)


def offline_microbatches(tmp_path, columns: dict, args: list[str], ranks: int | None = None) -> set[frozenset]:
    """Return the micro-batches (sets of sample ids) of ``sortpack run`` over a parquet file of ``columns``."""
    pq.write_table(pa.table(columns), tmp_path / "lengths.parquet")
    run_sortpack(["run", tmp_path / "lengths.parquet", "-o", tmp_path / "plan", "--size", "column:n", *args,
                  "--quiet"], ranks=ranks, timeout=300)
    index = PackedIndex(tmp_path / "plan")
    return {frozenset(index.microbatch(i).tolist()) for i in range(len(index))}


def batch_microbatches(plan) -> set[frozenset]:
    """Return the micro-batches of a ``BatchPlan`` as sets of indices."""
    return {frozenset(mb.tolist()) for r in range(plan.world_size) for mb in plan.rank(r)}


CASES = {
    "rows": ({}, ["--rows", "8192"], {}),
    "context parallel padding": ({}, ["--rows", "8192", "--pad-to-multiple", "8"], {"pad_to_multiple": 8}),
    "documents per row": ({}, ["--rows", "8192", "--max-segments", "3"], {"max_samples": 3}),
    "a second cap": ({"p": 1500}, ["--rows", "8192", "--size2", "column:p", "--max-size2", "3000"], {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_offline_plan_and_plan_batch_make_the_same_micro_batches(case, tmp_path):
    columns, args, kw = CASES[case]
    lengths = rollout_lengths(3000, seed=1)
    data = {"n": lengths}
    if columns:  # encoder patches per sample, at most 3,000 a micro-batch
        data["p"] = np.random.default_rng(2).integers(0, columns["p"], len(lengths))
        kw = {"caps": {"patches": (data["p"], 3000)}}
    offline = offline_microbatches(tmp_path, data, args)
    plan = plan_batch(lengths, world_size=1, max_tokens=8192, **kw)
    assert plan.stats["split"] == 0
    assert batch_microbatches(plan) == offline


@pytest.mark.slow
def test_two_row_windows_and_three_ranks_give_the_same_micro_batches(tmp_path):
    # past 65,536 samples the offline plan packs windows that each span the sorted sizes, on any rank count
    lengths = rollout_lengths(70_000, seed=3)
    offline = offline_microbatches(tmp_path, {"n": lengths}, ["--rows", "8192"], ranks=3)
    plan = plan_batch(lengths, world_size=1, max_tokens=8192)
    assert batch_microbatches(plan) == offline
