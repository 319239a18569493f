"""Scaling over ranks: row-range work units, parallel file description, index shards written by every rank."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack.format.manifest import read_manifest

from support import run_sortpack, write_text_parquet


def _data_files(d):
    return sorted(p.name for p in d.iterdir() if p.suffix == ".arrow")


def _assert_identical(a, b):
    assert _data_files(a) == _data_files(b)
    for name in _data_files(a):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert read_manifest(a)["content_hash"] == read_manifest(b)["content_hash"]


def _tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["abc def", "ghi jkl mno"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(path))
    return path


@pytest.mark.mpi
@pytest.mark.parametrize("size", ["length", "tokens"])
def test_one_row_group_spreads_over_four_ranks(tmp_path, size):
    n = 4003
    lengths = np.random.default_rng(3).integers(1, 300, n)
    src = write_text_parquet(tmp_path / "one.parquet", lengths, row_group_size=n)  # a single row group
    extra = ["--tokenizer", _tokenizer(tmp_path / "tok.json")] if size == "tokens" else []
    outs = {}
    for ranks in (1, 4):
        out = tmp_path / f"ix{ranks}"
        run_sortpack(["run", src, "-o", out, "--column", "text", "--size", size, *extra,
                      "--max-tokens", "3000", "--quiet"], ranks=ranks, timeout=180)
        outs[ranks] = out
    _assert_identical(outs[1], outs[4])
    rows = read_manifest(outs[4])["provenance"]["profile"]["analyze_rows_per_rank"]
    assert sum(rows) == n and len(rows) == 4
    assert max(abs(r - n / 4) for r in rows) <= 0.1 * n / 4  # every rank measured ~N/4 samples


@pytest.mark.mpi
def test_every_rank_writes_index_shards(tmp_path):
    n = 3000
    lengths = np.random.default_rng(5).integers(1, 300, n)
    src = write_text_parquet(tmp_path / "a.parquet", lengths, row_group_size=700)
    outs = {}
    for ranks in (1, 3):
        out = tmp_path / f"ix{ranks}"
        run_sortpack(["run", src, "-o", out, "--column", "text", "--max-tokens", "3000", "--profile"],
                     ranks=ranks, timeout=180,
                     env={"SORTPACK_TEST_SHARD_ROWS": "250", "SORTPACK_TEST_SHARD_SAMPLES": "250"})
        outs[ranks] = out
    _assert_identical(outs[1], outs[3])
    m = read_manifest(outs[3])
    assert m["samples_per_shard"] == 250 and len(m["shards"]) >= 9
    # shards hold about samples_per_shard samples each, however many micro-batches that is
    per = [e["num_samples"] for e in m["shards"]]
    assert sum(per) == n and max(per[:-1]) < 250 + 300
