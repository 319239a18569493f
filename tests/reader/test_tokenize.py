"""``tokenize=`` at read time over a ``--size tokens`` plan without stored tokens: once per document, as planned.

The plans are written by the real pipeline (``sortpack run``) from text; the collate helpers
tokenize the text back. A document ``--oversize split`` cut into pieces is tokenized once, not
once per piece; a tokenizer that truncates or pads (a tokenizer file's own settings) is refused
with one line as soon as a micro-batch's lengths differ from the plan's.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch")
from tokenizers import Tokenizer

from sortpack.errors import SortpackError
from sortpack.reader import PackedIndex, PackedSampler, SourceDataset
from sortpack.torch import pad_collate, varlen_collate

from support import make_tokenizer, run_sortpack

WORDS = ["hello", "world", "the", "quick", "brown", "fox"]


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Two long documents (500 and 300 words) among 60 short ones, and the tokenizer the plans count with."""
    base = tmp_path_factory.mktemp("tokenize")
    rng = np.random.default_rng(1)
    docs = [" ".join(rng.choice(WORDS, 500)), " ".join(rng.choice(WORDS, 300))]
    docs += [" ".join(rng.choice(WORDS, int(k))) for k in rng.integers(1, 30, 60)]
    pq.write_table(pa.table({"text": docs}), base / "d.parquet", row_group_size=20)
    return base, make_tokenizer(base / "tok.json")


def _plan(texts, name, *extra):
    base, tok = texts
    out = base / name
    if not (out / "manifest.json").is_file():
        run_sortpack(["run", base / "d.parquet", "-o", out, "--column", "text", "--size", "tokens", "--tokenizer", tok,
                      "--quiet", *extra])
    return out


class Counting:
    """``tokenize``: the plan's tokenizer on ``row["text"]``, counting its calls per text."""

    def __init__(self, path):
        self.tok = Tokenizer.from_file(str(path))
        self.calls: Counter = Counter()

    def __call__(self, row):
        self.calls[len(row["text"])] += 1
        return self.tok.encode(row["text"]).ids


def test_a_document_of_k_pieces_in_one_microbatch_is_tokenized_once(texts):
    """Row packing puts several pieces of a long document in one micro-batch: one tokenize call for all of them."""
    plan = _plan(texts, "rows", "--max-tokens", "64", "--oversize", "split", "--rows", "64",
                 "--rows-per-microbatch", "4")
    index = PackedIndex(plan)
    assert index.has_pieces
    most = 0
    for mb in PackedSampler(plan, rank=0, world_size=1):
        ds = SourceDataset(plan)  # a fresh dataset: nothing kept from another micro-batch
        tokenize = Counting(texts[1])
        batch = varlen_collate(tokenize=tokenize)(ds.__getitems__(mb))
        pieces = Counter(mb)
        assert sum(tokenize.calls.values()) == len(pieces), (mb.microbatch, pieces, tokenize.calls)
        most = max(most, max(pieces.values()))
        begin, end = index.piece_ranges(mb.microbatch)
        assert int(batch["lengths"].sum()) == int((end - begin).sum())
    assert most >= 3  # the case the test is about: a micro-batch held 3 or more pieces of one document


def test_consecutive_pieces_of_a_document_are_tokenized_once_per_pass(texts):
    """In plan order a long document's pieces come one micro-batch after another: it is tokenized once."""
    plan = _plan(texts, "padded", "--max-tokens", "64", "--oversize", "split")
    index = PackedIndex(plan)
    ds = SourceDataset(plan)
    tokenize = Counting(texts[1])
    collate = pad_collate(tokenize=tokenize)
    pieces = Counter()
    for mb in PackedSampler(plan, rank=0, world_size=1):
        batch = collate(ds.__getitems__(mb))
        begin, end = index.piece_ranges(mb.microbatch)
        assert int(batch["lengths"].sum()) == int((end - begin).sum())
        pieces.update(mb)
    long_docs = [i for i, k in pieces.items() if k > 1]
    assert len(long_docs) == 2 and min(pieces[i] for i in long_docs) >= 5
    assert sum(tokenize.calls.values()) == len(pieces)  # every document once, however many pieces


class Labelled(Counting):
    """``tokenize`` giving (ids, labels): every other token a target, no ``gives_labels`` or other attribute."""

    def __call__(self, row):
        ids = super().__call__(row)
        return ids, [t if k % 2 else -100 for k, t in enumerate(ids)]


def test_a_tokenize_giving_labels_has_them_cut_with_each_piece(texts):
    """A plain function returning (ids, labels) over a split plan: each piece's labels are its document's, cut with
    its ids (the first position -100), and each document is still tokenized once."""
    plan = _plan(texts, "padded", "--max-tokens", "64", "--oversize", "split")
    index = PackedIndex(plan)
    ds = SourceDataset(plan)
    tokenize = Labelled(texts[1])
    collate = pad_collate(tokenize=tokenize)
    whole = Tokenizer.from_file(str(texts[1]))
    docs = pq.read_table(texts[0] / "d.parquet").column("text").to_pylist()
    pieces = Counter()
    for mb in PackedSampler(plan, rank=0, world_size=1):
        batch = collate(ds.__getitems__(mb))
        begin, end = index.piece_ranges(mb.microbatch)
        for row, (sid, b, e) in enumerate(zip(list(mb), begin.tolist(), end.tolist())):
            ids = whole.encode(docs[sid]).ids[b:e]
            labels = [t if k % 2 else -100 for k, t in enumerate(whole.encode(docs[sid]).ids)][b:e]
            assert batch["input_ids"][row, :e - b].tolist() == ids
            assert batch["labels"][row].tolist() == [-100] + labels[1:] + [-100] * (batch["labels"].shape[1] - (e - b))
        pieces.update(mb)
    assert max(pieces.values()) >= 5
    assert sum(tokenize.calls.values()) == len(pieces)


def _reading(path, setting):
    tok = Tokenizer.from_file(str(path))
    if setting == "truncation":
        tok.enable_truncation(max_length=8)
    elif setting == "padding":
        tok.enable_padding(length=40)
    return tok


@pytest.mark.parametrize(("split", "setting"), [(False, "truncation"), (False, "padding"), (True, "truncation")])
@pytest.mark.parametrize("collate", [pad_collate, varlen_collate])
def test_a_tokenizer_that_truncates_or_pads_is_refused_in_one_line(texts, split, setting, collate):
    """(A split plan's pieces are cut from the ids, so a padded short sample's padding is cut away: no refusal.)"""
    plan = _plan(texts, "split" if split else "whole", "--max-tokens", "600" if not split else "64",
                 *(["--oversize", "split"] if split else []))
    tok = _reading(texts[1], setting)
    ds = SourceDataset(plan)
    fn = collate(tokenize=lambda row: tok.encode(row["text"]).ids)
    sampler = PackedSampler(plan, rank=0, world_size=1)
    with pytest.raises(SortpackError) as exc:
        for mb in sampler:
            fn(ds.__getitems__(mb))
    message = str(exc.value)
    assert "\n" not in message and message.startswith("micro-batch ")
    assert "the plan counted" in message and "tok.no_truncation()" in message and "tok.no_padding()" in message
    tok.no_truncation()
    tok.no_padding()
    for mb in sampler:  # as the plan counted: every micro-batch reads
        fn(ds.__getitems__(mb))


def test_the_tokenizer_file_s_own_truncation_is_what_the_plan_ignores(texts, tmp_path):
    """A tokenizer file saved with truncation on plans full lengths; reading with it as loaded is refused."""
    base, tok_path = texts
    tok = Tokenizer.from_file(tok_path)
    tok.enable_truncation(max_length=8)
    tok.save(str(tmp_path / "trunc.json"))
    out = tmp_path / "plan"
    run_sortpack(["run", base / "d.parquet", "-o", out, "--column", "text", "--size", "tokens", "--tokenizer",
                  tmp_path / "trunc.json", "--max-tokens", "600", "--quiet"])
    loaded = Tokenizer.from_file(str(tmp_path / "trunc.json"))
    ds = SourceDataset(out)
    fn = pad_collate(tokenize=lambda row: loaded.encode(row["text"]).ids)
    with pytest.raises(SortpackError, match="tok.no_truncation"):
        for mb in PackedSampler(out, rank=0, world_size=1):
            fn(ds.__getitems__(mb))
