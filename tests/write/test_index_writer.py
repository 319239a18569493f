"""The index's sample-id width: int32 when every input row number fits, int64 otherwise; identical
bytes for any rank count at either width (int64 at 1-4 ranks: tests/mpi/test_invariance_mpi.py), and
readers, ``verify`` and ``--store`` accept both."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from sortpack.format import verify_directory
from sortpack.format.schemas import INT32_ID_ROWS, sample_id_type
from sortpack.reader import PackedIndex, PackedSampler, SourceDataset
from sortpack.write import index_writer

from reader_fixtures import pipeline_index
from support import run_sortpack, write_text_parquet

SMALL = {"SORTPACK_TEST_SHARD_ROWS": "100"}


def manifest(d):
    return json.loads((d / "manifest.json").read_text())


def shard_table(d) -> pa.Table:
    return pa.concat_tables(pa.ipc.open_file(str(d / e["file"])).read_all() for e in manifest(d)["shards"])


def test_the_width_follows_the_largest_row_number(monkeypatch):
    monkeypatch.delenv("SORTPACK_TEST_ID_BITS", raising=False)
    assert INT32_ID_ROWS == 2**31
    # ids run 0 .. rows - 1: 2^31 rows still fit (largest id 2^31 - 1), one more does not
    for rows, want in [(0, pa.int32()), (1, pa.int32()), (2**31 - 1, pa.int32()), (2**31, pa.int32()),
                       (2**31 + 1, pa.int64()), (10**12, pa.int64())]:
        assert sample_id_type(rows) == want, rows
    monkeypatch.setenv("SORTPACK_TEST_ID_BITS", "64")
    assert sample_id_type(5) == pa.int64()


def test_the_width_is_decided_by_the_input_rows_not_the_packed_samples(tmp_path, monkeypatch):
    """``--oversize skip`` drops samples (here the last row); the bound is still the input's row count."""
    seen = []

    def spy(rows):
        seen.append(rows)
        return sample_id_type(rows)

    monkeypatch.setattr(index_writer, "sample_id_type", spy)
    lengths = np.array([5, 9, 3, 7, 2, 400])
    ix = pipeline_index(tmp_path / "ix", lengths, max_tokens=100, oversize="skip")
    m = manifest(ix)
    assert seen == [6] and m["num_samples"] == 5 and m["source"]["num_rows"] == 6
    assert m["schema"]["sample_ids"] == "list<item: int32>"


def test_both_widths_read_verify_and_store_the_same(tmp_path):
    """Indexes written by the pipeline at either width: the same ids, steps, stored rows and reports."""
    lengths = np.random.default_rng(3).integers(1, 300, size=500)
    data = write_text_parquet(tmp_path / "data.parquet", lengths, row_group_size=97)
    outs = {}
    for bits in (32, 64):
        env = {"SORTPACK_TEST_ID_BITS": "64"} if bits == 64 else {}
        out = tmp_path / f"plan{bits}"
        run_sortpack(["run", data, "-o", out, "--column", "text", "--max-tokens", "1200", "--store", "text,n",
                      "--quiet"], env={**SMALL, **env})
        outs[bits] = out
    m32, m64 = manifest(outs[32]), manifest(outs[64])
    assert m32["schema"]["sample_ids"] == "list<item: int32>" and m64["schema"]["sample_ids"] == "list<item: int64>"
    assert m32["content_hash"] != m64["content_hash"]  # the bytes differ, the plan does not
    assert m32["data"] == m64["data"]  # stored data shards: the same rows in the same order
    bytes32 = sum(e["bytes"] for e in m32["shards"])
    bytes64 = sum(e["bytes"] for e in m64["shards"])
    assert bytes32 < bytes64 - 3 * len(lengths)  # 4 bytes saved per id, less some padding
    for out in outs.values():
        assert verify_directory(out) == []
        assert run_sortpack(["verify", out]).returncode == 0
    ix32, ix64 = PackedIndex(outs[32]), PackedIndex(outs[64])
    assert ix32.id_dtype == np.int32 and ix64.id_dtype == np.int64
    assert [ix32.microbatch(i).tolist() for i in range(len(ix32))] == \
        [ix64.microbatch(i).tolist() for i in range(len(ix64))]
    batches = {}
    for bits, ix in ((32, ix32), (64, ix64)):
        sampler = PackedSampler(ix, rank=1, world_size=2, order="shuffle", seed=5)
        from_store, from_source = SourceDataset(ix, columns=["n"]), SourceDataset(ix, columns=["n"], stored=False)
        got = []
        for mb in sampler:
            assert all(type(x) is int for x in mb)
            for ds in (from_store, from_source):
                assert [r["n"] for r in ds.__getitems__(mb)] == lengths[list(mb)].tolist()
            got.append(list(mb))
        batches[bits] = got
        stored = ix.stored
        assert stored.take([499, 0, 7]).column("n").to_pylist() == lengths[[499, 0, 7]].tolist()
    assert batches[32] == batches[64] and batches[32]
    reports = [json.loads(run_sortpack(["inspect", out, "--world-size", "2", "--json"]).stdout)
               for out in outs.values()]
    for report in reports:
        for varies in ("content_hash", "directory"):
            report.pop(varies, None)
    assert reports[0] == reports[1]


def test_verify_reports_a_shard_whose_id_type_differs_from_the_manifest(tmp_path):
    lengths = np.random.default_rng(1).integers(1, 200, size=60)
    ix = pipeline_index(tmp_path / "ix", lengths, max_tokens=800)
    m = manifest(ix)
    m["schema"]["sample_ids"] = "list<item: int64>"
    from sortpack.format.manifest import content_hash

    m["content_hash"] = content_hash(m)
    (ix / "manifest.json").write_text(json.dumps(m))
    problems = verify_directory(ix)
    assert len(problems) == 1 and "differ from the manifest's schema" in problems[0]
