"""``--oversize split``: long samples become pieces that fit; read back, the pieces are exactly the document."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from sortpack.reader import PackedIndex  # noqa: E402
from sortpack.torch import (  # noqa: E402
    PackedBatchSampler,
    PlanLoader,
    SourceDataset,  # noqa: E402
    pad_collate,
    varlen_collate,
)

from support import make_special_tokenizer, run_sortpack  # noqa: E402

WORDS = [f"w{i}" for i in range(40)]
SMALL = {"SORTPACK_TEST_SHARD_ROWS": "40", "SORTPACK_TEST_DATA_ROWS": "50"}


def manifest(d):
    return json.loads((d / "manifest.json").read_text())


def shards(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "manifest.json"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Texts of 0-300 words (some empty), a [CLS]/[SEP] tokenizer, and a list column of ids."""
    base = tmp_path_factory.mktemp("split")
    rng = np.random.default_rng(7)
    lengths = np.concatenate([rng.integers(1, 40, size=120), rng.integers(100, 300, size=30), [0, 0, 64, 62]])
    rng.shuffle(lengths)
    texts = [" ".join(rng.choice(WORDS, size=int(n))) for n in lengths]
    tok_path = make_special_tokenizer(base / "tok.json", texts=[" ".join(WORDS)])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    ids = [np.asarray(rng.integers(1, 1000, size=int(n) * 2), np.int32) for n in lengths]
    pq.write_table(pa.table({"text": texts[:80], "input_ids": pa.array(ids[:80], pa.list_(pa.int32()))}),
                   base / "a.parquet", row_group_size=25)
    pq.write_table(pa.table({"text": texts[80:], "input_ids": pa.array(ids[80:], pa.list_(pa.int32()))}),
                   base / "b.parquet", row_group_size=25)
    return {"dir": base, "files": [base / "a.parquet", base / "b.parquet"], "tok": tok, "tok_path": tok_path,
            "texts": texts, "ids": ids}


def pieces_of(plan, loader_items):
    """Return {sample id: [(begin, values)]} from (micro-batch info, per-sample values) pairs, repeats left out."""
    ix = PackedIndex(plan)
    got = defaultdict(list)
    for info, values in loader_items:
        if info["repeat"]:
            continue
        begin, _ = ix.piece_ranges(info["microbatch"])
        for sid, b, v in zip(ix.microbatch(info["microbatch"]).tolist(), begin.tolist(), values):
            got[sid].append((b, v))
    return got


def collated(plan, collate, key):
    """Return (info, per-sample token lists) of every micro-batch of one epoch through PlanLoader."""
    sampler = PackedBatchSampler(plan, rank=0, world_size=1)
    out = []
    for batch in PlanLoader(SourceDataset(plan), sampler, collate):
        if key == "pad":
            rows = [r[:n].tolist() for r, n in zip(batch["input_ids"], batch["lengths"])]
        else:
            cu = batch["cu_seqlens"].tolist()
            flat = batch["input_ids"].reshape(-1).tolist()
            rows = [flat[a:b] for a, b in zip(cu[:-1], cu[1:])][:len(batch["sample_ids"])]
        out.append((batch["microbatch"], rows))
    return out


def assert_whole(got, expected):
    """Assert every non-empty document's pieces, in order, are exactly its values (each unit once)."""
    want = {i: v for i, v in expected.items() if len(v)}
    assert set(got) == set(want)
    for sid, parts in got.items():
        parts.sort(key=lambda p: p[0])
        joined = [t for _, v in parts for t in v] if not isinstance(parts[0][1], str) else "".join(v for _, v in parts)
        assert joined == want[sid], sid


TOKENS = ["--column", "text", "--size", "tokens", "--max-tokens", "64", "--oversize", "split"]


@pytest.mark.slow
@pytest.mark.parametrize("store", [False, True])
def test_token_pieces_read_back_as_the_documents_tokens(tmp_path, corpus, store):
    plan = tmp_path / "plan"
    extra = ["--store-tokens"] if store else []
    run_sortpack(["run", *corpus["files"], "-o", plan, *TOKENS, "--tokenizer", corpus["tok_path"], *extra, "--quiet"])
    tok = corpus["tok"]
    encoded = {i: tok.encode(t).ids for i, t in enumerate(corpus["texts"]) if t}
    m = manifest(plan)
    over = [i for i, ids in encoded.items() if len(ids) > 64]
    assert m["stats"]["split"] == len(over) > 0
    assert m["stats"]["split_tokens"] == sum(len(encoded[i]) for i in over)
    assert m["stats"]["tokens"] == sum(len(v) for v in encoded.values())  # not a token lost or repeated
    assert m["schema"]["piece_begin"] == "list<item: int64>"
    ix = PackedIndex(plan)
    assert (ix["max_size"] <= 64).all()
    if store:
        pad = collated(plan, pad_collate(key="input_ids"), "pad")
        var = collated(plan, varlen_collate(key="input_ids"), "var")
    else:
        def tokenize(row):
            return tok.encode(row["text"]).ids

        pad = collated(plan, pad_collate(tokenize=tokenize), "pad")
        var = collated(plan, varlen_collate(tokenize=tokenize), "var")
    for loop in (pad, var):
        got = pieces_of(plan, loop)
        assert_whole(got, encoded)
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        for sid in over:  # the special tokens stay once, where the tokenizer put them
            flat = [t for _, v in sorted(got[sid], key=lambda p: p[0]) for t in v]
            assert flat.count(cls) == 1 and flat.count(sep) == 1 and flat[0] == cls and flat[-1] == sep


@pytest.mark.slow
@pytest.mark.parametrize("store", [False, True])
def test_list_column_pieces_read_back_as_the_lists(tmp_path, corpus, store):
    plan = tmp_path / "plan"
    extra = ["--store", "input_ids"] if store else []
    run_sortpack(["run", *corpus["files"], "-o", plan, "--column", "input_ids", "--size", "length",
                  "--max-tokens", "100", "--oversize", "split", *extra, "--quiet"])
    expected = {i: v.tolist() for i, v in enumerate(corpus["ids"])}
    assert_whole(pieces_of(plan, collated(plan, pad_collate(key="input_ids"), "pad")), expected)
    assert_whole(pieces_of(plan, collated(plan, varlen_collate(key="input_ids"), "var")), expected)
    assert (PackedIndex(plan)["max_size"] <= 100).all()


@pytest.mark.parametrize("store", [False, True])
def test_text_pieces_are_character_ranges(tmp_path, corpus, store):
    """Under --size length a piece is a range of characters: multi-byte characters are never cut."""
    texts = [t.replace("w1", "wé").replace("w2", "漢字") for t in corpus["texts"]]
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": texts}), src, row_group_size=30)
    plan = tmp_path / "plan"
    extra = ["--store", "text"] if store else []
    run_sortpack(["run", src, "-o", plan, "--column", "text", "--max-tokens", "300", "--oversize", "split", *extra,
                  "--quiet"])
    sampler = PackedBatchSampler(plan, rank=0, world_size=1)
    items = [(b.microbatch.info(), [row["text"] for row in b]) for b in PlanLoader(SourceDataset(plan), sampler)]
    assert_whole(pieces_of(plan, items), dict(enumerate(texts)))
    assert manifest(plan)["stats"]["split"] == sum(len(t) > 300 for t in texts) > 0


@pytest.mark.parametrize("size", ["words", "column:n"])
def test_split_refuses_a_size_it_cannot_cut(tmp_path, size):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a b c"] * 4, "n": [1, 2, 3, 4]}), src)
    proc = run_sortpack(["run", src, "-o", tmp_path / "p", "--column", "text", "--size", size, "--max-tokens", "2",
                         "--oversize", "split"], check=False)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--oversize split" in lines[0], proc.stderr
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.metrics").exists()


@pytest.mark.slow
def test_a_plan_without_oversize_samples_has_no_piece_columns(tmp_path, corpus):
    args = ["--column", "text", "--max-tokens", "5000", "--quiet"]
    run_sortpack(["run", *corpus["files"], "-o", tmp_path / "a", *args])
    run_sortpack(["run", *corpus["files"], "-o", tmp_path / "b", *args, "--oversize", "split"])
    assert "piece_begin" not in manifest(tmp_path / "b")["schema"]
    assert shards(tmp_path / "a") == shards(tmp_path / "b")


@pytest.mark.slow
def test_pack_of_a_sorted_directory_splits_and_sorts_the_pieces(tmp_path, corpus):
    args = ["--column", "text", "--size", "tokens", "--tokenizer", corpus["tok_path"]]
    run_sortpack(["run", *corpus["files"], "-o", tmp_path / "run", *args, "--max-tokens", "64", "--oversize", "split",
                  "--quiet"])
    run_sortpack(["analyze", *corpus["files"], "-o", tmp_path / "m", *args, "--quiet"])
    run_sortpack(["sort", tmp_path / "m", "-o", tmp_path / "s", "--quiet"])
    run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "p", "--max-tokens", "64", "--oversize", "split", "--quiet"])
    a, b = manifest(tmp_path / "run")["stats"], manifest(tmp_path / "p")["stats"]
    for key in ("tokens", "num_samples", "num_microbatches", "split", "split_pieces", "split_tokens", "padded_tokens"):
        assert a[key] == b[key], key
    ix = PackedIndex(tmp_path / "p")
    assert np.all(np.diff(ix["max_size"]) >= 0)  # the pieces were sorted by their own sizes


@pytest.mark.mpi
@pytest.mark.slow
def test_split_plans_are_byte_identical_at_1_to_4_ranks(tmp_path, corpus):
    outs = []
    for ranks in (1, 2, 3, 4):
        out = tmp_path / f"plan{ranks}"
        run_sortpack(["run", *corpus["files"], "-o", out, *TOKENS, "--tokenizer", corpus["tok_path"],
                      "--store-tokens", "--store", "text", "--quiet"], ranks=ranks, env=SMALL, timeout=180)
        outs.append(out)
    for other in outs[1:]:
        assert shards(other) == shards(outs[0])
        assert manifest(other)["content_hash"] == manifest(outs[0])["content_hash"]
    assert len(manifest(outs[0])["shards"]) > 1 and len(manifest(outs[0])["data"]["shards"]) > 1


@pytest.mark.slow
def test_inspect_reports_the_tokens_truncate_skip_and_split_lose_or_keep(tmp_path, corpus):
    args = ["--column", "text", "--size", "tokens", "--tokenizer", corpus["tok_path"], "--max-tokens", "64"]
    tok = corpus["tok"]
    sizes = np.array([len(tok.encode(t).ids) for t in corpus["texts"] if t])
    over = sizes[sizes > 64]
    reports = {}
    for policy in ("split", "truncate", "skip"):
        proc = run_sortpack(["run", *corpus["files"], "-o", tmp_path / policy, *args, "--oversize", policy])
        reports[policy] = json.loads(run_sortpack(["inspect", tmp_path / policy, "--json"]).stdout)
        assert f"--oversize {policy}" in proc.stderr
    assert reports["split"]["split"] == len(over) and reports["split"]["split_tokens"] == int(over.sum())
    assert reports["split"]["tokens"] == int(sizes.sum())
    assert reports["truncate"]["truncated_tokens"] == int((over - 64).sum())
    assert reports["truncate"]["tokens"] == int(sizes.sum()) - int((over - 64).sum())
    assert reports["skip"]["skipped_tokens"] == int(over.sum())
    assert reports["skip"]["tokens"] == int(sizes.sum()) - int(over.sum())


@pytest.mark.slow
def test_row_packing_and_keep_intermediate_take_pieces_too(tmp_path, corpus):
    args = ["--column", "input_ids", "--size", "length", "--oversize", "split"]
    run_sortpack(["run", *corpus["files"], "-o", tmp_path / "rows", *args, "--rows", "128", "--store", "input_ids",
                  "--keep-intermediate", "--quiet"])
    expected = {i: v.tolist() for i, v in enumerate(corpus["ids"])}
    assert_whole(pieces_of(tmp_path / "rows", collated(tmp_path / "rows", varlen_collate(key="input_ids"), "varlen")),
                 expected)
    # the sorted directory keeps the pieces (a begin column), and pack reads them back as they are
    assert "begin" in manifest(tmp_path / "rows.sorted")["schema"]
    run_sortpack(["pack", tmp_path / "rows.sorted", "-o", tmp_path / "again", "--rows", "128", "--oversize", "split",
                  "--quiet"])
    assert shards(tmp_path / "again") == {k: v for k, v in shards(tmp_path / "rows").items()
                                          if k.startswith("microbatches")}


@pytest.mark.mpi
@pytest.mark.slow
def test_pack_split_of_a_sorted_directory_is_byte_identical_at_any_rank_count(tmp_path, corpus):
    args = ["--column", "text", "--size", "tokens", "--tokenizer", corpus["tok_path"]]
    run_sortpack(["analyze", *corpus["files"], "-o", tmp_path / "m", *args, "--quiet"], env=SMALL)
    run_sortpack(["sort", tmp_path / "m", "-o", tmp_path / "s", "--quiet"], env=SMALL)
    outs = []
    for ranks in (1, 2, 3):
        out = tmp_path / f"p{ranks}"
        run_sortpack(["pack", tmp_path / "s", "-o", out, "--max-tokens", "64", "--oversize", "split", "--quiet"],
                     ranks=ranks, env=SMALL, timeout=180)
        outs.append(out)
    for other in outs[1:]:
        assert shards(other) == shards(outs[0])
        assert manifest(other)["content_hash"] == manifest(outs[0])["content_hash"]


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["1", "2"])
@pytest.mark.parametrize("how", ["run", "pack"])
def test_a_budget_that_leaves_no_room_beside_the_special_tokens_is_refused(tmp_path, corpus, budget, how):
    # [CLS] + one token made a first piece "empty", and packing dropped it: a token per document lost
    # under a line that said "none lost"
    measure = ["--column", "text", "--size", "tokens", "--tokenizer", corpus["tok_path"]]
    if how == "run":
        cmd = ["run", *corpus["files"], *measure]
    else:
        run_sortpack(["run", *corpus["files"], *measure, "-o", tmp_path / "m", "--max-tokens", "512",
                      "--keep-intermediate", "--quiet"])
        cmd = ["pack", tmp_path / "m.sorted"]
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = run_sortpack([*cmd, "-o", tmp_path / "plan", "--max-tokens", budget, "--oversize", "split"], check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"--max-tokens {budget} with --oversize split" in lines[0] and "2 special tokens" in lines[0], lines
    assert "at least 3 tokens" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no .metrics kept


def test_the_smallest_budget_with_room_keeps_every_token_and_says_so(tmp_path, corpus):
    tok = corpus["tok"]
    sizes = np.array([len(tok.encode(t).ids) for t in corpus["texts"]])
    content = sizes[sizes > 2]  # an empty text is [CLS] [SEP]: no content, dropped
    proc = run_sortpack(["run", *corpus["files"], "-o", tmp_path / "plan", "--column", "text", "--size", "tokens",
                         "--tokenizer", corpus["tok_path"], "--max-tokens", "3", "--oversize", "split"])
    m = manifest(tmp_path / "plan")
    assert m["stats"]["tokens"] == int(content.sum())  # every token of every document, in some piece
    assert m["stats"]["empty_dropped"] == int((sizes <= 2).sum())
    over = content[content > 3]
    assert (m["stats"]["split"], m["stats"]["split_tokens"]) == (len(over), int(over.sum()))
    assert f"({int(over.sum())} tokens, none lost)" in proc.stderr


@pytest.mark.parametrize("size, unit", [("length", "characters or list elements"), ("bytes", "bytes"),
                                        ("tokens", "tokens")])
def test_the_split_line_names_the_unit_it_counts(tmp_path, corpus, size, unit):
    extra = ["--tokenizer", corpus["tok_path"]] if size == "tokens" else []
    proc = run_sortpack(["run", *corpus["files"], "-o", tmp_path / "plan", "--column", "text", "--size", size,
                         *extra, "--max-tokens", "64", "--oversize", "split"])
    s = manifest(tmp_path / "plan")["stats"]
    line = next(x for x in proc.stderr.splitlines() if "--oversize split cut" in x)
    assert line.endswith(f"({s['split_tokens']} {unit}, none lost)"), line


@pytest.mark.slow
def test_a_held_out_plan_counts_its_own_split_documents(tmp_path, corpus):
    # the held-out documents' pieces were counted in the training plan, and the held-out plan said split 0
    args = ["--column", "text", "--size", "tokens", "--tokenizer", corpus["tok_path"], "--max-tokens", "64",
            "--oversize", "split"]
    run_sortpack(["run", *corpus["files"], "-o", tmp_path / "all", *args, "--quiet"])
    run_sortpack(["run", *corpus["files"], "-o", tmp_path / "plan", *args, "--holdout", "0.3", "--quiet"])
    whole, train, held = (manifest(d)["stats"] for d in (tmp_path / "all", tmp_path / "plan",
                                                           tmp_path / "plan" / "holdout"))
    ix = PackedIndex(tmp_path / "plan" / "holdout")
    cut = set()  # the held-out documents with a second piece
    for i in range(ix.num_microbatches):
        begin, _ = ix.piece_ranges(i)
        cut.update(ix.microbatch(i)[begin > 0].tolist())
    assert held["split"] == len(cut) > 0
    for key in ("split", "split_pieces", "split_tokens"):
        assert train[key] + held[key] == whole[key], key
