"""Samples of size 0: dropped at plan time with a one-line count (``--keep-empty`` keeps them), any rank count."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sortpack.reader import PackedIndex

from support import run_sortpack, write_text_parquet

SMALL = {"SORTPACK_TEST_SHARD_ROWS": "50"}



def manifest(d):
    return json.loads((d / "manifest.json").read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two parquet files of 600 texts, 90 of them empty, spread over both files and the size range."""
    base = tmp_path_factory.mktemp("empty")
    lengths = np.random.default_rng(4).integers(1, 100, size=600)
    empty = np.random.default_rng(5).choice(600, size=90, replace=False)
    lengths[empty] = 0
    files = [write_text_parquet(base / "a.parquet", lengths[:350], row_group_size=70),
             write_text_parquet(base / "b.parquet", lengths[350:], row_group_size=70)]
    return files, lengths


def test_run_says_how_many_empty_samples_it_dropped(tmp_path, data):
    # the dropped samples at 1-4 ranks in three packing modes: tests/mpi/test_invariance_mpi.py
    files, _ = data
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "400"], env=SMALL)
    assert "dropped 90 empty samples (no content; --keep-empty keeps them)" in proc.stdout
    assert manifest(tmp_path / "plan")["stats"]["empty_dropped"] == 90


@pytest.mark.slow
def test_keep_empty_keeps_them_and_pack_takes_it_too(tmp_path, data):
    files, lengths = data
    kept = tmp_path / "kept"
    proc = run_sortpack(["run", *files, "-o", kept, "--column", "text", "--max-tokens", "400", "--keep-empty"])
    assert "dropped" not in proc.stdout
    ix = PackedIndex(kept)
    assert ix.num_samples == 600 and manifest(kept)["options"]["keep_empty"] is True
    assert manifest(kept)["stats"]["empty"] == 90 and manifest(kept)["stats"]["empty_dropped"] == 0
    run_sortpack(["analyze", *files, "-o", tmp_path / "m", "--column", "text", "--quiet"])
    run_sortpack(["sort", tmp_path / "m", "-o", tmp_path / "s", "--quiet"])
    dropped = run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "p", "--max-tokens", "400"])
    assert "dropped 90 empty samples" in dropped.stdout
    assert PackedIndex(tmp_path / "p").num_samples == 510
    run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "pk", "--max-tokens", "400", "--keep-empty", "--quiet"])
    assert PackedIndex(tmp_path / "pk").num_samples == 600
    quiet = run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "q", "--max-tokens", "400", "--quiet"])
    assert quiet.stdout == ""
    report = json.loads(run_sortpack(["inspect", tmp_path / "p", "--json"]).stdout)
    assert report["empty_dropped"] == 90


@pytest.mark.slow
def test_special_tokens_only_is_empty_under_size_tokens(tmp_path):
    """An empty (or blank) text measures [CLS] [SEP] under --size tokens: it is dropped as empty all the same."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from support import make_special_tokenizer

    tok = make_special_tokenizer(tmp_path / "tok.json")
    texts = ["hello world"] * 5 + [""] * 4 + ["   "] * 2 + ["the quick brown fox"] * 3
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": texts}), src)
    args = ["--column", "text", "--size", "tokens", "--tokenizer", tok, "--max-tokens", "64"]
    proc = run_sortpack(["run", src, "-o", tmp_path / "p", *args])
    assert "dropped 6 empty samples (no content; --keep-empty keeps them)" in proc.stdout
    ix = PackedIndex(tmp_path / "p")
    assert sorted(ix.all_sample_ids().tolist()) == [0, 1, 2, 3, 4, 11, 12, 13]
    assert manifest(tmp_path / "p")["options"]["empty_size"] == 2
    kept = run_sortpack(["run", src, "-o", tmp_path / "k", *args, "--keep-empty"])
    assert "dropped" not in kept.stdout and PackedIndex(tmp_path / "k").num_samples == 14
    # the separate commands read what analyze decided from the metrics manifest
    run_sortpack(["analyze", src, "-o", tmp_path / "m", *args[:-2], "--quiet"])
    run_sortpack(["sort", tmp_path / "m", "-o", tmp_path / "s", "--quiet"])
    run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "q", "--max-tokens", "64", "--quiet"])
    assert PackedIndex(tmp_path / "q").num_samples == 8
    # without special tokens nothing changes: only size 0 is empty, and no empty_size is recorded
    run_sortpack(["run", src, "-o", tmp_path / "n", *args, "--no-special-tokens", "--quiet"])
    assert PackedIndex(tmp_path / "n").num_samples == 8
    assert "empty_size" not in manifest(tmp_path / "n")["options"]
