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
    assert "dropped 90 empty samples (size 0; --keep-empty keeps them)" in proc.stdout
    assert manifest(tmp_path / "plan")["stats"]["empty_dropped"] == 90


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
