"""``--oversize split`` in a mixture: every source's long documents become pieces, blended, read back exactly."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from sortpack.reader import PackedIndex, SourceDataset  # noqa: E402
from sortpack.torch import PackedBatchSampler, PlanLoader, pad_collate, varlen_collate  # noqa: E402

from support import assert_same_at_ranks, make_special_tokenizer, read_manifest, run_sortpack  # noqa: E402

WORDS = [f"w{i}" for i in range(40)]
SMALL = {"SORTPACK_TEST_SHARD_ROWS": "40", "SORTPACK_TEST_DATA_ROWS": "50"}


def _texts(rng, n):
    """Return ``n`` short texts, a quarter as many long ones, and an empty one, shuffled."""
    lengths = np.concatenate([rng.integers(1, 40, size=n), rng.integers(100, 300, size=n // 4), [0]])
    rng.shuffle(lengths)
    return [" ".join(rng.choice(WORDS, size=int(k))) for k in lengths]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two sources: web (two files, column ``text``) and code (its text in ``content``, its ids in ``toks``)."""
    root = tmp_path_factory.mktemp("mixsplit")
    rng = np.random.default_rng(11)
    web, code = _texts(rng, 60), _texts(rng, 40)
    web_ids = [rng.integers(1, 1000, size=len(t) // 2).astype(np.int32) for t in web]
    code_ids = [rng.integers(1, 1000, size=len(t) // 2).astype(np.int32) for t in code]
    for name in ("web", "code", "plain", "wide"):
        (root / name).mkdir()
    for name, a, b in (("a", 0, 40), ("b", 40, len(web))):
        pq.write_table(pa.table({"text": web[a:b], "ids": pa.array(web_ids[a:b], pa.list_(pa.int32()))}),
                       root / "web" / f"{name}.parquet", row_group_size=15)
    pq.write_table(pa.table({"content": code, "toks": pa.array(code_ids, pa.list_(pa.int32())),
                             "text": ["not the text"] * len(code)}), root / "code" / "a.parquet", row_group_size=15)
    pq.write_table(pa.table({"text": code}), root / "plain" / "a.parquet", row_group_size=15)  # code, as `text`
    wide = [t.replace("w1", "é").replace("w2", "中").replace("w3", "😀") for t in code]  # 1-4 bytes a character
    pq.write_table(pa.table({"text": wide}), root / "wide" / "a.parquet", row_group_size=15)
    tok_path = make_special_tokenizer(root / "tok.json", texts=[" ".join(WORDS)])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    texts = web + code  # global sample ids: web's files in order, then code
    held = sum(len(tok.encode(t).ids) for t in texts if t)

    def mix(name, columns, total=None):
        code_dir = "code/" if columns[1] else "plain/"
        spec = {"sources": [{"name": "web", "inputs": ["web/"], "weight": 0.6, "column": columns[0]},
                            {"name": "code", "inputs": [code_dir], "weight": 0.4, "column": columns[1]}]}
        if total is not None:
            spec["total_tokens"] = total
        (root / name).write_text(json.dumps(spec))
        return root / name

    return {"root": root, "tok": tok, "tok_path": tok_path, "texts": texts, "wide": web + wide,
            "blend": f"60 {root / 'web'} 40 {root / 'wide'}",
            "ids": [v.tolist() for v in web_ids + code_ids], "held_tokens": held,
            # every source used more than once (whole passes and a part pass), and code's text renamed
            "repeat": mix("repeat.json", (None, "content"), 4 * held),
            "repeat_ids": mix("repeat_ids.json", ("ids", "toks"), 4 * sum(len(v) for v in web_ids + code_ids)),
            # one shared column (one analyze of the union), every source used about half: part passes alone
            "half": mix("half.json", (None, None), sum(map(len, texts)) // 2)}  # in characters


def _read(plan, collate=None, field="text"):
    """Return (sample id, piece begin, values) of every sample of one epoch through PlanLoader, in plan order."""
    ix = PackedIndex(plan)
    sampler = PackedBatchSampler(plan, rank=0, world_size=1)
    out = []
    for batch in PlanLoader(SourceDataset(plan), sampler, collate):
        if collate is None:
            info, values = batch.microbatch.info(), [row[field] for row in batch]
        elif "cu_seqlens" in batch:
            info = batch["microbatch"]
            cu, flat = batch["cu_seqlens"].tolist(), batch[field].reshape(-1).tolist()
            values = [flat[a:b] for a, b in zip(cu[:-1], cu[1:])][:len(batch["sample_ids"])]
        else:
            info = batch["microbatch"]
            values = [r[:n].tolist() for r, n in zip(batch[field], batch["lengths"])]
        assert not info["repeat"]
        begin, _ = ix.piece_ranges(info["microbatch"])
        out.extend(zip(ix.microbatch(info["microbatch"]).tolist(), begin.tolist(), values))
    return out


def _check_pieces(plan, items, docs, field_units=len):
    """Assert every piece is its document's units from its begin, and each source's whole passes hold each
    document's units exactly once per pass (pieces used between ``whole_passes`` and ``most_uses`` times)."""
    m = read_manifest(plan)
    uses = Counter((sid, b) for sid, b, _ in items)
    pieces = defaultdict(dict)
    for sid, b, v in items:
        n = field_units(v)
        assert n > 0 and v == docs[sid][b:b + n], (sid, b)
        pieces[sid][b] = v
    assert sum(field_units(v) for _, _, v in items) == m["stats"]["tokens"] == m["mixture"]["tokens"]
    for src in m["mixture"]["sources"]:
        first, rows = src["first_sample"], src["num_rows"]
        mine = {k: c for k, c in uses.items() if first <= k[0] < first + rows}
        assert all(src["whole_passes"] <= c <= src["most_uses"] for c in mine.values()), src["name"]
        if src["whole_passes"] >= 1:  # every document whole: its pieces tile it once
            for sid in range(first, first + rows):
                if not len(docs[sid]):
                    continue
                parts = [pieces[sid][b] for b in sorted(pieces[sid])]
                whole = isinstance(docs[sid], (str, bytes))
                joined = parts[0][:0].join(parts) if whole else [t for p in parts for t in p]
                assert joined == docs[sid], sid
    return m


def _run(corpus, mix, out, *extra, ranks=None):
    run_sortpack(["run", "--mixture", corpus[mix], "-o", out, "--oversize", "split", "--quiet", *extra],
                 ranks=ranks, env=SMALL)
    return out


TOKENS = ("--size", "tokens", "--max-tokens", "64")


@pytest.mark.parametrize("store", [True, False])
@pytest.mark.slow
def test_token_pieces_of_a_mixture_read_back_as_each_documents_tokens(tmp_path, corpus, store):
    plan = _run(corpus, "repeat", tmp_path / "plan", *TOKENS, "--tokenizer", corpus["tok_path"],
                *(["--store-tokens"] if store else []))
    tok = corpus["tok"]
    docs = [tok.encode(t).ids if t else [] for t in corpus["texts"]]
    m = read_manifest(plan)
    over = [d for d in docs if len(d) > 64]
    assert m["stats"]["split"] == len(over) > 0 and m["stats"]["split_tokens"] == sum(map(len, over))
    assert m["options"]["column"] == "text" and "piece_begin" in m["schema"]
    assert (PackedIndex(plan)["max_size"] <= 64).all()
    assert all(s["whole_passes"] >= 1 and s["part_pass"]["samples"] > 0 for s in m["mixture"]["sources"])
    if store:
        loops = [pad_collate(key="input_ids"), varlen_collate(key="input_ids")]
    else:
        def tokenize(row):  # code's `content` is read as `text`, as the docs say
            return tok.encode(row["text"]).ids

        loops = [pad_collate(tokenize=tokenize), varlen_collate(tokenize=tokenize)]
    for collate in loops:
        _check_pieces(plan, _read(plan, collate, "input_ids"), docs)


@pytest.mark.slow
@pytest.mark.parametrize("store", [True, False])
def test_character_pieces_of_a_mixture_with_a_renamed_column(tmp_path, corpus, store):
    plan = _run(corpus, "repeat", tmp_path / "plan", "--max-tokens", "300",
                *(["--store", "text"] if store else []))
    m = _check_pieces(plan, _read(plan), corpus["texts"])
    assert m["stats"]["split"] == sum(len(t) > 300 for t in corpus["texts"]) > 0
    assert m["options"]["column"] == "text" and m["options"]["size"] == "length"
    assert ("data" in m) == store


@pytest.mark.slow
def test_list_pieces_of_a_mixture(tmp_path, corpus):
    plan = _run(corpus, "repeat_ids", tmp_path / "plan", "--max-tokens", "60", "--store", "ids")
    m = _check_pieces(plan, _read(plan, pad_collate(key="ids"), "input_ids"), corpus["ids"])
    assert m["stats"]["split"] == sum(len(v) > 60 for v in corpus["ids"]) > 0
    assert m["options"]["column"] == "ids"


@pytest.mark.slow
def test_a_part_pass_chooses_pieces_and_the_holdout_keeps_documents_whole(tmp_path, corpus):
    plan = _run(corpus, "half", tmp_path / "plan", "--max-tokens", "300", "--holdout", "0.2")
    m = _check_pieces(plan, _read(plan), corpus["texts"])
    assert m["stats"]["split"] > 0
    assert all(s["whole_passes"] == 0 and s["most_uses"] == 1 for s in m["mixture"]["sources"])
    assert m["options"]["column"] == "text"  # named although no source or option named it
    items = _read(plan)
    used = {sid for sid, _, _ in items}
    # a piece is a plan sample: the part pass chooses pieces, so a long document may give some of them
    got = Counter()
    for sid, _, v in items:
        got[sid] += len(v)
    assert any(0 < got[sid] < len(corpus["texts"][sid]) for sid in used)
    held = _read(plan / "holdout")
    assert not used & {sid for sid, _, _ in held}
    for sid in {sid for sid, _, _ in held}:  # every held-out document once, whole
        parts = sorted((b, v) for s, b, v in held if s == sid)
        assert "".join(v for _, v in parts) == corpus["texts"][sid]


@pytest.mark.slow
def test_a_mixtures_split_line_and_stats_count_what_each_plan_holds(tmp_path, corpus):
    # the line said "tokens" for the whole union, held-out documents and units the plan never uses included
    proc = run_sortpack(["run", "--mixture", corpus["half"], "-o", tmp_path / "plan", "--oversize", "split",
                         "--max-tokens", "300", "--holdout", "0.2"], env=SMALL)
    train = json.loads((tmp_path / "plan" / "manifest.json").read_text())["stats"]
    held = json.loads((tmp_path / "plan" / "holdout" / "manifest.json").read_text())["stats"]
    docs = [len(t) for t in corpus["texts"]]
    held_ids = {sid for sid, _, _ in _read(tmp_path / "plan" / "holdout")}
    cut = [n for sid, n in enumerate(docs) if n > 300]
    held_cut = [docs[sid] for sid in held_ids if docs[sid] > 300]
    assert held["split"] == len(held_cut) > 0 and held["split_tokens"] == sum(held_cut)
    assert train["split"] + held["split"] == len(cut) and train["split_tokens"] + held["split_tokens"] == sum(cut)
    line = next(x for x in proc.stderr.splitlines() if "--oversize split cut" in x)
    assert line == (f"sortpack: --oversize split cut {train['split']} of the sources' samples into "
                    f"{train['split_pieces']} pieces that fit the budget ({train['split_tokens']} characters or list "
                    f"elements of the sources, none lost in the cut; the plan uses them as the schedule says)")


BYTES = ("--size", "bytes", "--max-tokens", "100")


@pytest.mark.slow
@pytest.mark.parametrize("store", [True, False])
def test_byte_pieces_of_a_blend_are_whole_characters(tmp_path, corpus, store):
    """Sources reading one column (``--blend``): texts cut between UTF-8 characters, read back exactly."""
    plan = tmp_path / "plan"
    run_sortpack(["run", "--blend", corpus["blend"], "--total-tokens", str(3 * sum(len(t.encode())
                  for t in corpus["wide"])), "-o", plan, "--oversize", "split", *BYTES, "--quiet",
                  *(["--store", "text"] if store else [])])
    items = [(sid, b, v.encode()) for sid, b, v in _read(plan)]  # a str: valid UTF-8 on its own
    m = _check_pieces(plan, items, [t.encode() for t in corpus["wide"]])
    assert m["stats"]["split"] == sum(len(t.encode()) > 100 for t in corpus["wide"]) > 0
    assert m["options"]["column"] == "text" and all(len(v) <= 100 for _, _, v in items)
    assert any(len(v) < 100 and b + len(v) < len(corpus["wide"][sid].encode()) for sid, b, v in items)


@pytest.mark.slow
def test_split_under_size_bytes_is_refused_where_a_source_reads_its_own_column(tmp_path, corpus):
    proc = run_sortpack(["run", "--mixture", corpus["repeat"], "-o", tmp_path / "p", *BYTES, "--oversize", "split"],
                        check=False)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--size bytes" in lines[0], proc.stderr
    assert "'code' reads 'content'" in lines[0] and not (tmp_path / "p").exists()


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and p.name != "manifest.json"}


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["tokens", "bytes"])
@pytest.mark.slow
def test_a_split_mixture_is_byte_identical_at_1_to_4_ranks(tmp_path, corpus, kind):
    if kind == "tokens":  # sources analyzed apart (code's own column), stored token ids
        extra = ("--mixture", corpus["repeat"], *TOKENS, "--tokenizer", corpus["tok_path"], "--store-tokens")
    else:  # sources analyzed together, cuts placed while read
        extra = ("--blend", corpus["blend"], *BYTES)
    outs = assert_same_at_ranks(["run", *extra, "--oversize", "split", "--store", "text", "--quiet"],
                                tmp_path, env=SMALL)
    m = read_manifest(outs[0])
    assert m["stats"]["split"] > 0 and len(m["shards"]) > 1 and len(m["data"]["shards"]) > 1


@pytest.mark.mpi
@pytest.mark.slow
def test_a_split_mixture_with_part_passes_and_a_holdout_is_byte_identical_at_1_to_4_ranks(tmp_path, corpus):
    outs = [_run(corpus, "half", tmp_path / f"p{k}", "--max-tokens", "300", "--store", "text", "--holdout", "0.2",
                 ranks=k) for k in (1, 2, 3, 4)]
    for sub in ("", "holdout"):
        want = _files(outs[0] / sub)
        assert want and "piece_begin" in read_manifest(outs[0] / sub)["schema"]
        for other in outs[1:]:
            assert _files(other / sub) == want, (other, sub)
            assert read_manifest(other / sub)["content_hash"] == read_manifest(outs[0] / sub)["content_hash"]
    assert len(read_manifest(outs[0])["data"]["shards"]) > 1
