"""The index's sample-id width: int32 when every input row number fits, int64 otherwise; identical
bytes for any rank count at either width (int64 at 1-4 ranks: tests/mpi/test_invariance_mpi.py), and
readers, ``verify`` and ``--store`` accept both."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from sortpack.format import verify_directory
from sortpack.format.schemas import INT32_ID_ROWS, sample_id_type
from sortpack.reader import PackedIndex, PackedSampler, SourceDataset
from sortpack.write import index_writer
from sortpack.write.owned import PieceRanges, owned_microbatches

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


@pytest.mark.slow
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


# --- the planning half without MPI: a rank's owned micro-batches and the tables cut from them -----

from sortpack.format.schemas import index_schema  # noqa: E402  (this block's own import)


def _owned(rows_mode=False, pieces=False):
    """Three micro-batches of 2, 0 and 3 samples; in rows mode rows of (1, 1), (), (2, 1)."""
    cols = {name: np.array(v) for name, v in {
        "microbatch": [7, 8, 9], "num_samples": [2, 0, 3], "batch_size": [2, 0, 2], "max_size": [5, 0, 9],
        "padded_size": [10, 0, 27], "tokens": [8, 0, 20], "min_key": [1.0, 0.0, 4.0],
        "max_key": [5.0, 0.0, 9.0], "stage": [0, 0, 1]}.items()}
    ids = np.array([4, 2, 0, 1, 3], dtype=np.int64)
    ranges = PieceRanges(np.arange(5) * 10, np.arange(5) * 10 + 3) if pieces else None
    row_sizes = np.array([1, 1, 2, 1]) if rows_mode else None
    owned = owned_microbatches(7, cols, ids, ranges, row_sizes)
    return owned, index_schema(rows=rows_mode, id_type=pa.int32(), pieces=pieces)


def test_owned_microbatches_know_their_offsets_and_rows():
    owned, _ = _owned(rows_mode=True)
    assert owned.count == 3 and owned.offsets.tolist() == [0, 2, 2, 5]
    assert owned.samples_in(0, 3) == 5 and owned.samples_in(1, 2) == 0
    assert owned.row_offsets.tolist() == [0, 2, 2, 4] and owned.row_starts.tolist() == [0, 1, 2, 4, 5]
    assert _owned()[0].row_offsets is None


def test_an_index_table_holds_each_micro_batch_s_ids_rows_and_pieces():
    owned, schema = _owned(rows_mode=True, pieces=True)
    t = index_writer.index_table(owned, schema, 0, 3)
    assert t.schema == schema
    assert t.column("sample_ids").to_pylist() == [[4, 2], [], [0, 1, 3]]
    assert t.column("sample_ids").type == pa.list_(pa.int32())
    # where each row starts in the micro-batch's sample ids, then the end
    assert t.column("row_splits").to_pylist() == [[0, 1, 2], [0], [0, 2, 3]]
    assert t.column("piece_begin").to_pylist() == [[0, 10], [], [20, 30, 40]]
    assert t.column("piece_end").to_pylist() == [[3, 13], [], [23, 33, 43]]
    assert t.column("microbatch").to_pylist() == [7, 8, 9]


def test_an_index_table_does_not_depend_on_where_shards_are_cut():
    for rows_mode in (False, True):
        owned, schema = _owned(rows_mode=rows_mode, pieces=True)
        whole = index_writer.index_table(owned, schema, 0, 3)
        for k in range(4):
            parts = [index_writer.index_table(owned, schema, a, b) for a, b in ((0, k), (k, 3))]
            assert pa.concat_tables(parts).equals(whole)


def test_the_manifest_takes_the_stored_data_and_the_extra_keys(monkeypatch):
    from sortpack.format.manifest import DATA_VERSION, VERSION
    from sortpack.parallel import SerialComm
    from sortpack.stages.analyze import AnalyzeOptions
    from sortpack.stages.pack import Microbatches, PackOptions
    from sortpack.stages.plan_options import PlanOptions
    from sortpack.write.plan_record import PlanRecord
    from sortpack.write.provenance import JobInfo, Profile
    from sortpack.write.store.result import ExchangeStats, StoreResult

    owned, schema = _owned()
    mbs = Microbatches(first=0, total=3, sample_ids=owned.sample_ids, offsets=owned.offsets, columns=owned.columns,
                       stats={"num_samples": 5})
    files = [{"path": "a.parquet", "rows": 5}]
    options = PlanOptions(AnalyzeOptions(), pack=PackOptions(max_tokens=9))
    plain = index_writer.index_manifest(mbs, schema, PlanRecord(options, files, Profile(SerialComm()), JobInfo([])),
                                        [], {"host": "h"})
    assert plain["version"] == VERSION and "data" not in plain and plain["num_microbatches"] == 3
    # the locations are provenance: the source records the rest
    assert plain["source"] == {"num_rows": 5, "files": [{"rows": 5}]} and plain["provenance"] == {"host": "h"}
    stats = ExchangeStats(rounds=1, memory_limit=8, round_budget=1, spills=0, spill_batches=0, seconds={})
    stored = StoreResult(columns=["text"], schema={"text": "string"}, rows_per_shard=300, num_rows=5, shards=[],
                         exchange=stats)
    record = PlanRecord(options, files, Profile(SerialComm()), JobInfo([]), {"mixture": {"k": 1}})
    m = index_writer.with_data(index_writer.index_manifest(mbs, schema, record, [], {}), stored)
    assert m["version"] == DATA_VERSION and m["data"] == stored.manifest_data() and m["mixture"] == {"k": 1}
