"""benchmarks/train_payoff: the baseline batchings and a tiny run of the sortpack methods."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmarks import train_payoff as tp


def test_random_batches_are_a_permutation_in_fixed_sizes():
    lens = np.arange(1, 102)
    batches = tp.random_batches(lens, 16, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(101))
    assert [len(b) for b in batches] == [16] * 6 + [5]
    assert batches != tp.random_batches(lens, 16, seed=4)


def test_group_by_length_sorts_inside_megabatches_only():
    lens = np.random.default_rng(0).integers(1, 1000, 1000)
    batches = tp.group_by_length_batches(lens, 4, seed=1, mega=5)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    flat = [i for b in batches for i in b]
    for a in range(0, 1000, 20):  # each megabatch of 5 batches of 4: longest first
        chunk = lens[flat[a:a + 20]]
        assert (np.diff(chunk) <= 0).all()
    assert not (np.diff(lens[flat]) <= 0).all()  # but not the whole epoch


def test_lengths_follow_the_scale():
    scale = tp.SCALES["small"]
    lens = tp.lengths(scale)
    assert len(lens) == scale.samples and lens.min() >= 1 and lens.max() <= scale.max_len
    assert abs(np.median(lens) - scale.median) <= 0.15 * scale.median


@pytest.mark.torch
@pytest.mark.slow
def test_sortpack_methods_run_on_indexes_the_cli_wrote(tmp_path):
    pytest.importorskip("torch")
    scale = replace(tp.SCALES["small"], samples=400, seconds=0.2, warmup_steps=1)
    results, setup = tp.run_all("test", scale, ["sortpack_padded", "sortpack_rows_flex"], work=tmp_path)
    padded, rows = results
    assert setup["samples"] == 400 and (tmp_path / "rows" / "manifest.json").is_file()
    for r in results:
        assert r.tokens_per_s > 0 and 0 <= r.padding < 1 and r.steps >= 1
    assert rows.shapes <= 2  # --rows: one static shape, but a stage's last micro-batch may hold fewer rows
    assert padded.padding < 0.2
    header, cells = tp.table(results)
    assert len(cells) == 2 and all(len(c) == len(header) for c in cells)
