"""Scaling over ranks: row-range work units, parallel file description, index shards written by every rank."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack.format.manifest import read_manifest

from support import assert_same_at_ranks, write_text_parquet


def _tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["abc def", "ghi jkl mno"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(path))
    return path


@pytest.mark.mpi
@pytest.mark.parametrize("size", ["length", "tokens"])
@pytest.mark.slow
def test_one_row_group_spreads_over_four_ranks(tmp_path, size):
    n = 4003
    lengths = np.random.default_rng(3).integers(1, 300, n)
    src = write_text_parquet(tmp_path / "one.parquet", lengths, row_group_size=n)  # a single row group
    extra = ["--tokenizer", _tokenizer(tmp_path / "tok.json")] if size == "tokens" else []
    outs = assert_same_at_ranks(["run", src, "--column", "text", "--size", size, *extra, "--max-tokens", "3000",
                                 "--quiet"], tmp_path, ranks=(1, 4))
    rows = read_manifest(outs[1])["provenance"]["profile"]["analyze_rows_per_rank"]
    assert sum(rows) == n and len(rows) == 4
    assert max(abs(r - n / 4) for r in rows) <= 0.1 * n / 4  # every rank measured ~N/4 samples


@pytest.mark.mpi
@pytest.mark.slow
def test_every_rank_writes_index_shards(tmp_path):
    n = 3000
    lengths = np.random.default_rng(5).integers(1, 300, n)
    src = write_text_parquet(tmp_path / "a.parquet", lengths, row_group_size=700)
    small = {"SORTPACK_TEST_SHARD_ROWS": "250", "SORTPACK_TEST_SHARD_SAMPLES": "250"}
    outs = assert_same_at_ranks(["run", src, "--column", "text", "--max-tokens", "3000", "--profile"], tmp_path,
                                ranks=(1, 3), env=small)
    m = read_manifest(outs[1])
    assert m["samples_per_shard"] == 250 and len(m["shards"]) >= 9
    # shards hold about samples_per_shard samples each, however many micro-batches that is
    per = [e["num_samples"] for e in m["shards"]]
    assert sum(per) == n and max(per[:-1]) < 250 + 300
