"""``--size bytes --oversize split``: a text becomes pieces of whole UTF-8 characters that fit the byte budget."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch")

from sortpack.reader import PackedIndex, SourceDataset  # noqa: E402
from sortpack.torch import PackedBatchSampler, PlanLoader  # noqa: E402

from support import assert_same_outputs, read_manifest, run_sortpack  # noqa: E402

BUDGET = 16
CHARS = np.array(["a", "b", " ", "é", "中", "😀"])  # 1, 1, 1, 2, 3 and 4 bytes
SMALL = {"SORTPACK_TEST_SHARD_ROWS": "40", "SORTPACK_TEST_DATA_ROWS": "50"}
BYTES = ["--column", "text", "--size", "bytes", "--max-tokens", str(BUDGET), "--oversize", "split"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Texts of 0-80 characters of 1-4 bytes in a Parquet file (row groups of 25) and a JSONL file."""
    base = tmp_path_factory.mktemp("split_bytes")
    rng = np.random.default_rng(11)
    lengths = np.concatenate([rng.integers(0, 6, size=60), rng.integers(6, 80, size=40)])
    rng.shuffle(lengths)
    texts = ["".join(rng.choice(CHARS, size=int(n))) for n in lengths]
    pq.write_table(pa.table({"text": texts[:70], "n": np.arange(70)}), base / "a.parquet", row_group_size=25)
    with open(base / "b.jsonl", "w", encoding="utf-8") as fh:
        for i, t in enumerate(texts[70:]):
            fh.write(json.dumps({"text": t, "n": 70 + i}, ensure_ascii=False) + "\n")
    return {"files": [base / "a.parquet", base / "b.jsonl"], "texts": texts}


def read_pieces(plan, stored: bool) -> dict[int, list[tuple[int, str]]]:
    """Return {sample id: [(piece begin, piece text)]} of one epoch through PlanLoader over SourceDataset."""
    ix = PackedIndex(plan)
    got = defaultdict(list)
    sampler = PackedBatchSampler(plan, rank=0, world_size=1)
    for batch in PlanLoader(SourceDataset(plan, stored=stored), sampler):
        info = batch.microbatch.info()
        begin, _ = ix.piece_ranges(info["microbatch"])
        for sid, b, row in zip(ix.microbatch(info["microbatch"]).tolist(), begin.tolist(), batch):
            got[sid].append((b, row["text"]))
    return got


def assert_documents(got, texts):
    """Assert each piece is valid UTF-8 of at most BUDGET bytes and each document's pieces make it exactly."""
    want = {i: t for i, t in enumerate(texts) if t}
    assert set(got) == set(want)
    straddled = 0
    for sid, parts in got.items():
        parts.sort()
        data = want[sid].encode("utf-8")
        offset = 0
        for begin, piece in parts:
            raw = piece.encode("utf-8")  # a str: decoded, so valid UTF-8
            assert begin == offset and 0 < len(raw) <= BUDGET and data[begin:begin + len(raw)] == raw, sid
            offset += len(raw)
            straddled += offset < len(data) and len(raw) < BUDGET  # cut short of a character across the budget
        assert offset == len(data), sid
    assert straddled > 0  # characters did straddle cut points


@pytest.mark.parametrize("store", [False, True])
def test_byte_pieces_read_back_as_the_documents(tmp_path, corpus, store):
    plan = tmp_path / "plan"
    extra = ["--store", "text,n"] if store else []
    proc = run_sortpack(["run", *corpus["files"], "-o", plan, *BYTES, *extra])
    sizes = np.array([len(t.encode()) for t in corpus["texts"]])
    m = read_manifest(plan)
    assert m["stats"]["split"] == int((sizes > BUDGET).sum()) > 0
    assert m["stats"]["split_tokens"] == int(sizes[sizes > BUDGET].sum())
    assert m["stats"]["tokens"] == int(sizes.sum())  # not a byte lost or repeated
    assert m["options"]["size"] == "bytes" and m["schema"]["piece_begin"] == "list<item: int64>"
    assert "--oversize split cut" in proc.stderr
    assert (PackedIndex(plan)["max_size"] <= BUDGET).all()
    assert_documents(read_pieces(plan, stored=False), corpus["texts"])
    if store:
        assert m["data"]["pieces"]["cut"] == ["text"]
        assert_documents(read_pieces(plan, stored=True), corpus["texts"])
        ix = PackedIndex(plan)
        for i in range(ix.num_microbatches):  # the stored text of each piece is its byte range
            begin, end = ix.piece_ranges(i)
            texts = ix.stored.microbatch(i).column("text").to_pylist()
            assert [len(t.encode()) for t in texts] == (end - begin).tolist()


@pytest.mark.slow
def test_pack_of_a_sorted_directory_cuts_at_the_same_bytes(tmp_path, corpus):
    run_sortpack(["run", *corpus["files"], "-o", tmp_path / "run", *BYTES, "--quiet"])
    run_sortpack(["analyze", *corpus["files"], "-o", tmp_path / "m", *BYTES[:4], "--quiet"])
    run_sortpack(["sort", tmp_path / "m", "-o", tmp_path / "s", "--quiet"])
    run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "p", *BYTES[4:], "--store", "text", "--quiet"])
    a, b = read_manifest(tmp_path / "run")["stats"], read_manifest(tmp_path / "p")["stats"]
    for key in ("tokens", "num_samples", "num_microbatches", "split", "split_pieces", "split_tokens"):
        assert a[key] == b[key], key
    # run cut while analyze read the text, pack read the oversize texts back: the same cuts
    assert piece_set(tmp_path / "run") == piece_set(tmp_path / "p")
    assert_documents(read_pieces(tmp_path / "p", stored=True), corpus["texts"])


def piece_set(plan) -> set[tuple[int, int, int]]:
    """Return every (sample id, begin, end) of a plan."""
    ix = PackedIndex(plan)
    out = set()
    for i in range(ix.num_microbatches):
        begin, end = ix.piece_ranges(i)
        out |= set(zip(ix.microbatch(i).tolist(), begin.tolist(), end.tolist()))
    return out


def test_binary_values_are_cut_at_any_byte(tmp_path):
    values = [bytes(range(i, i + n)) for i, n in enumerate([3, 40, 0, 17, 16, 5])]
    pq.write_table(pa.table({"blob": values}), tmp_path / "b.parquet")
    plan = tmp_path / "plan"
    run_sortpack(["run", tmp_path / "b.parquet", "-o", plan, "--column", "blob", "--size", "bytes", "--max-tokens",
                  "16", "--oversize", "split", "--store", "blob", "--quiet"])
    ix = PackedIndex(plan)
    for stored in (True, False):
        got = defaultdict(list)
        for batch in PlanLoader(SourceDataset(plan, stored=stored), PackedBatchSampler(plan, rank=0, world_size=1)):
            mb = batch.microbatch.info()["microbatch"]
            for sid, b, row in zip(ix.microbatch(mb).tolist(), ix.piece_ranges(mb)[0].tolist(), batch):
                got[sid].append((b, row["blob"]))
        assert {s: b"".join(v for _, v in sorted(p)) for s, p in got.items()} == \
            {i: v for i, v in enumerate(values) if v}
        assert sorted(len(v) for p in got.values() for _, v in p) == [1, 3, 5, 8, 16, 16, 16, 16]


def test_a_character_longer_than_the_budget_is_one_clear_error(tmp_path):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["ab", "😀", "abc"]}), src)
    proc = run_sortpack(["run", src, "-o", tmp_path / "p", "--column", "text", "--size", "bytes", "--max-tokens", "3",
                         "--oversize", "split"], check=False, timeout=60)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "sample 1 holds a character of 4 bytes" in lines[0] and "--max-tokens" in lines[0]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("size", ["length", "bytes"])
@pytest.mark.parametrize("how", ["run", "run --store", "pack --store"])
@pytest.mark.slow
def test_split_without_column_cuts_the_column_analyze_reads(tmp_path, corpus, size, how):
    # no --column: analyze reads `text` (the inputs' text column); the plan must name it, or the
    # store and the reader would cut nothing and hand every piece the whole document
    flags = ["--size", size, "--max-tokens", str(BUDGET), "--oversize", "split"]
    store = ["--store", "text"] if "--store" in how else []
    plan = tmp_path / "plan"
    if how.startswith("run"):
        run_sortpack(["run", *corpus["files"], "-o", plan, *flags, *store, "--quiet"])
    else:
        run_sortpack(["analyze", *corpus["files"], "-o", tmp_path / "m", *flags[:2], "--quiet"])
        run_sortpack(["sort", tmp_path / "m", "-o", tmp_path / "s", "--quiet"])
        run_sortpack(["pack", tmp_path / "s", "-o", plan, *flags[2:], *store, "--quiet"])
    assert read_manifest(plan)["options"]["column"] == "text"
    got = read_pieces(plan, stored=bool(store))
    if size == "bytes":
        assert_documents(got, corpus["texts"])
        return
    want = {i: t for i, t in enumerate(corpus["texts"]) if t}
    assert set(got) == set(want)
    for sid, parts in got.items():
        parts.sort()
        assert all(0 < len(piece) <= BUDGET and want[sid][b:b + len(piece)] == piece for b, piece in parts), sid
        assert "".join(piece for _, piece in parts) == want[sid], sid


def test_split_refuses_a_column_it_cannot_name(tmp_path):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["abcdef"], "title": ["x"]}), src)  # no --column, no `text`, not one column
    proc = run_sortpack(["run", src, "-o", tmp_path / "p", "--size", "bytes", "--max-tokens", "3",
                         "--oversize", "split"], check=False, timeout=60)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--column" in lines[0], proc.stderr
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.metrics").exists()


@pytest.mark.mpi
@pytest.mark.slow
def test_byte_split_plans_are_byte_identical_at_1_to_4_ranks(tmp_path, corpus):
    outs = []
    for ranks in (1, 2, 3, 4):
        out = tmp_path / f"plan{ranks}"
        run_sortpack(["run", *corpus["files"], "-o", out, *BYTES, "--store", "text,n", "--quiet"], ranks=ranks,
                     env=SMALL, timeout=180)
        outs.append(out)
    assert_same_outputs(*outs)
    m = read_manifest(outs[0])
    assert len(m["shards"]) > 1 and len(m["data"]["shards"]) > 1 and m["stats"]["split"] > 0
    assert_documents(read_pieces(outs[-1], stored=True), corpus["texts"])
