"""``--oversize split`` gives one plan whatever the route: ``run``, ``pack`` of run's own sorted directory, and
``sort`` + ``pack`` of its metrics write the same bytes (content_hash and every shard), at any rank count."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.parallel import SerialComm
from sortpack.stages.samples import SampleColumns
from sortpack.stages.sort import SortOptions, sort_samples

from support import conversations, make_chat_tokenizer, make_special_tokenizer, read_manifest, run_sortpack

SMALL = {"SORTPACK_TEST_SHARD_ROWS": "40", "SORTPACK_TEST_DATA_ROWS": "50", "SORTPACK_TEST_SHARD_SAMPLES": "60"}
WORDS = [f"w{i}" for i in range(40)]


def test_pieces_sort_by_key_then_sample_then_begin_whatever_their_order():
    # pieces of equal size tie on the key: (sample id, begin) breaks the tie, not where the pieces happened to be
    sid = np.array([9, 4, 9, 4, 2, 9], np.int64)
    begin = np.array([20, 0, 10, 10, 0, 0], np.int64)
    size = np.array([3, 10, 10, 10, 3, 10], np.int64)
    ordered = sort_samples(SerialComm(), SampleColumns(0, 6, sid, size, size, None, [], 0, begin), SortOptions(), 100)
    got = list(zip(ordered.size.tolist(), ordered.sample_id.tolist(), ordered.begin.tolist()))
    assert got == sorted(zip(size.tolist(), sid.tolist(), begin.tolist()))


def test_piece_counts_group_a_documents_pieces_wherever_they_lie():
    from sortpack.stages.split import piece_counts

    sid = np.array([7, 3, 7, 5, 7, 3], np.int64)
    size = np.array([4, 8, 8, 2, 8, 1], np.int64)
    assert piece_counts(SerialComm(), sid, size) == {"split": 2, "split_pieces": 5, "split_tokens": 29}
    held = sid == 3
    assert piece_counts(SerialComm(), sid, size, ~held) == {"split": 1, "split_pieces": 3, "split_tokens": 20}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Texts of 1-300 words in two Parquet files, a [CLS]/[SEP] tokenizer, and long chats with a ChatML template."""
    base = tmp_path_factory.mktemp("routes")
    rng = np.random.default_rng(11)
    lengths = np.concatenate([rng.integers(1, 40, size=140), rng.integers(100, 300, size=40)])
    texts = [" ".join(rng.choice(WORDS, size=int(n))) for n in lengths]
    pq.write_table(pa.table({"text": texts[:90]}), base / "a.parquet", row_group_size=30)
    pq.write_table(pa.table({"text": texts[90:]}), base / "b.parquet", row_group_size=30)
    tok = make_special_tokenizer(base / "tok.json", texts=[" ".join(WORDS)])
    tokenizer, config = make_chat_tokenizer(base / "chat")
    with open(base / "chats.jsonl", "w") as f:
        for chat in conversations(150, seed=5):
            f.write(json.dumps({"messages": chat * 3}) + "\n")
    return {"texts": [base / "a.parquet", base / "b.parquet"], "tok": tok, "chats": [base / "chats.jsonl"],
            "chat": ["--tokenizer", tokenizer, "--chat-template", config]}


def _routes(tmp_path, files, measure: list, pack: list, ranks: int) -> list:
    """Run the three routes to a split plan; return their output directories."""
    run_sortpack(["run", *files, "-o", tmp_path / "run", *measure, *pack, "--keep-intermediate", "--quiet"],
                 ranks=ranks, env=SMALL, timeout=240)
    run_sortpack(["pack", tmp_path / "run.sorted", "-o", tmp_path / "again", *pack, "--quiet"], ranks=ranks,
                 env=SMALL, timeout=240)
    run_sortpack(["sort", tmp_path / "run.metrics", "-o", tmp_path / "staged.sorted", "--quiet"], ranks=ranks,
                 env=SMALL, timeout=240)
    run_sortpack(["pack", tmp_path / "staged.sorted", "-o", tmp_path / "staged", *pack, "--quiet"], ranks=ranks,
                 env=SMALL, timeout=240)
    return [tmp_path / "run", tmp_path / "again", tmp_path / "staged"]


def _files(directory) -> dict:
    """Return every data file below ``directory`` (the held-out plan's too) by relative path, with its bytes."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def _assert_one_plan(outs: list) -> None:
    first = read_manifest(outs[0])
    assert first["stats"]["split"] > 0 and len(first["shards"]) > 1
    for other in outs[1:]:
        manifest = read_manifest(other)
        assert manifest["content_hash"] == first["content_hash"], other.name
        assert manifest["stats"] == first["stats"], other.name
        assert manifest.get("holdout") == first.get("holdout"), other.name
        assert _files(other) == _files(outs[0]), other.name


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_token_pieces_one_plan_whatever_the_route(tmp_path, inputs, ranks):
    measure = ["--column", "text", "--size", "tokens", "--tokenizer", inputs["tok"]]
    _assert_one_plan(_routes(tmp_path, inputs["texts"], measure, ["--max-tokens", "64", "--oversize", "split",
                                                                  "--holdout", "12"], ranks))


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 3])
def test_plain_text_pieces_one_plan_whatever_the_route(tmp_path, inputs, ranks):
    for size in ("length", "bytes"):
        outs = _routes(tmp_path / size, inputs["texts"], ["--column", "text", "--size", size],
                       ["--rows", "300", "--oversize", "split"], ranks)
        _assert_one_plan(outs)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 3])
def test_chat_pieces_and_their_labels_one_plan_whatever_the_route(tmp_path, inputs, ranks):
    # the pieces' targets and the stored ids and labels too (pack encodes the chats it cuts again)
    outs = _routes(tmp_path, inputs["chats"], [], [*inputs["chat"], "--max-tokens", "200", "--oversize", "split",
                                                   "--store-tokens"], ranks)
    _assert_one_plan(outs)
    assert read_manifest(outs[0])["stats"]["targets"] > 0
