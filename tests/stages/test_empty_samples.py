"""Samples of size 0: dropped at plan time with a one-line count (``--keep-empty`` keeps them), any rank count."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sortpack.reader import PackedIndex

from support import run_sortpack, write_text_parquet

SMALL = {"SORTPACK_TEST_SHARD_ROWS": "50"}
MODES = {"padded": ["--max-tokens", "400", "--segment-size", "300"],
         "shapes": ["--max-tokens", "400", "--shapes", "16,64,128", "--segment-size", "300"],
         "rows": ["--rows", "128", "--rows-per-microbatch", "2"]}


def manifest(d):
    return json.loads((d / "manifest.json").read_text())


def shards(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "manifest.json"}


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


@pytest.mark.mpi
@pytest.mark.parametrize("mode", sorted(MODES))
def test_empty_samples_are_dropped_identically_at_any_rank_count(tmp_path, data, mode):
    files, lengths = data
    outs = []
    for ranks in (1, 2, 3):
        out = tmp_path / f"plan{ranks}"
        proc = run_sortpack(["run", *files, "-o", out, "--column", "text", *MODES[mode]], ranks=ranks, env=SMALL)
        assert "dropped 90 empty samples (size 0; --keep-empty keeps them)" in proc.stdout
        outs.append(out)
    for other in outs[1:]:
        assert shards(other) == shards(outs[0])
        assert manifest(other)["content_hash"] == manifest(outs[0])["content_hash"]
    ix = PackedIndex(outs[0])
    ids = np.sort(ix.all_sample_ids())
    assert ids.tolist() == np.flatnonzero(lengths > 0).tolist()  # the rest keep their sample ids
    assert (ix["tokens"] > 0).all()  # never a micro-batch of pure padding
    assert manifest(outs[0])["stats"]["empty_dropped"] == 90
    assert int(ix["tokens"].sum()) == int(lengths.sum())  # every token is still there


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
