"""SentencePiece-style tokenizer.json files (Mistral 7B v0.1 and v0.3) through the compiled BPE: the file's ids.

Mistral's own SentencePiece models from a registry package (mistral-common), written as the tokenizer.json the
Hugging Face converter writes (``benchmarks/real_vocab.py``), in both shapes of its space replacement; real
multilingual text and code, the edge texts and texts holding the added tokens, through ``encode_texts`` and the
column path; what is refused, with its reason; a plan under MPI the same with and without the compiled path.
"""
from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("tokenizers")

from tokenizer_fixtures import EDGE, column_lists, fast_lists, hf_reference, stdlib_sources

from benchmarks.real_vocab import SP_VARIANTS, mixed_texts
from sortpack.inputs.bpe_conversion import Refused
from sortpack.inputs.sp_conversion import sp_conversion
from sortpack.inputs.specs import load_tokenizer
from sortpack.kernels import sp_bpe

from support import output_files, read_manifest, run_sortpack

COMPILED = sp_bpe._library() is not None
MISTRAL = ["[INST] What is 2 + 2? [/INST] 4</s>", "<s>[INST]hi[/INST]", "a</s>b<s>", "[control_8]x", "<unk>"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Real text in many languages, real code, the edge texts and texts holding Mistral's added tokens."""
    return mixed_texts(160, longest=4000) + stdlib_sources(12) + EDGE + MISTRAL


@pytest.mark.skipif(not COMPILED, reason="the compiled kernel is not built")
@pytest.mark.parametrize("name", sorted(SP_VARIANTS))
def test_mistral_vocabularies_take_the_compiled_path_with_the_files_ids(sentencepiece_vocabularies, texts, name):
    path = sentencepiece_vocabularies(name)
    enc = load_tokenizer(path)
    assert enc.engine == "compiled", enc.reason
    record = enc.record()
    assert record["encoder"] == "compiled" and record["bpe"] == "sentencepiece"
    for special in (True, False):
        want = hf_reference(path, texts, special)
        assert fast_lists(enc, texts, special) == want
        ids, counts = column_lists(enc, texts, special)
        assert ids == want and counts == [len(w) for w in want]
    back = pickle.loads(pickle.dumps(enc))  # to DataLoader workers
    assert back.engine == "compiled" and fast_lists(back, texts[:30], True) == fast_lists(enc, texts[:30], True)


@pytest.mark.skipif(not COMPILED, reason="the compiled kernel is not built")
@pytest.mark.parametrize("name,after", [("mistral-v1", sp_bpe.ALWAYS), ("mistral-v3-metaspace", sp_bpe.NEVER),
                                        ("mistral-v3-metaspace-always", sp_bpe.UNLESS_THERE)])
def test_a_conversion_knows_what_text_a_token_stands_for_and_what_follows_an_added_token(
        sentencepiece_vocabularies, name, after):
    # the chat path's byte offsets (finetune/sp_chats.py): a token's text, its replacement a space's one byte
    path = sentencepiece_vocabularies(name)
    conv = load_tokenizer(path).sentencepiece
    assert conv.after_added == after and conv.plain == frozenset(conv.special)
    sizes = conv.text_bytes()
    vocab = _spec(path)["model"]["vocab"]
    made = set(conv.vocab.merges[:, 2].tolist()) | set(conv.vocab.chars.values())
    for token, i in vocab.items():
        if token.startswith("<0x") and len(token) == 6:
            assert sizes[i] == 1
        elif i in made:
            assert sizes[i] == len(token.replace("\u2581", " ").encode("utf-8")), token
    assert conv.segment_table() is not None
    if after != conv.vocab.prepend:  # its own table, the replacement put in front of no text
        ids, _ = sp_bpe.encode(conv.segment_table(), (np.frombuffer(b"a b", np.uint8), np.array([0, 3])))
        assert ids.tolist() == load_tokenizer(path).hf.encode("<s>a b", add_special_tokens=False).ids[1:]


def _spec(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


REFUSALS = {
    "no byte fallback": lambda s: s["model"].update(byte_fallback=False),
    "ignore_merges": lambda s: s["model"].update(ignore_merges=True),
    "dropout": lambda s: s["model"].update(dropout=0.1),
    "lacks some of the 256": lambda s: s["model"]["vocab"].pop("<0x41>"),
    "not Replace": lambda s: s.update(normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}),
    "splits words": lambda s: s.update(normalizer=None, pre_tokenizer={
        "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}),
    "no space replacement": lambda s: s.update(normalizer=None, pre_tokenizer=None),
    "matched in the normalized text": lambda s: s["added_tokens"][1].update(normalized=True),
    "post-processor is not one": lambda s: s.update(post_processor={"type": "Custom"}),
    "names or makes no token": lambda s: s["model"]["merges"].append(["\u2581", "\u2581zz"]),
}


@pytest.mark.parametrize("why", sorted(REFUSALS))
def test_files_the_kernel_would_not_run_exactly_are_refused_with_their_reason(sentencepiece_vocabularies, tmp_path,
                                                                             why):
    from tokenizers import Tokenizer

    spec = _spec(sentencepiece_vocabularies("mistral-v1"))
    REFUSALS[why](spec)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    try:
        hf = Tokenizer.from_file(str(path))
    except Exception:  # noqa: BLE001 - an edit tokenizers itself refuses: check the decision alone
        hf = None
    with pytest.raises(Refused, match=why):
        sp_conversion(spec, hf)
    if hf is not None:  # tokenizers encodes it, and says why the compiled path did not
        enc = load_tokenizer(str(path))
        assert enc.engine == "tokenizers" and why in enc.record()["why_not_compiled"]
        sample = ["hello world", " x\n", "[INST] a [/INST]"]
        if why != "dropout":  # dropout's ids are random
            assert fast_lists(enc, sample, True) == hf_reference(str(path), sample, True)


@pytest.mark.skipif(not COMPILED, reason="the compiled kernel is not built")
def test_the_switch_turns_the_compiled_path_off(sentencepiece_vocabularies, monkeypatch):
    monkeypatch.setenv("SORTPACK_FAST_TOKENIZER", "0")
    enc = load_tokenizer(sentencepiece_vocabularies("mistral-v1"))
    assert enc.engine == "tokenizers"


@pytest.mark.slow
@pytest.mark.skipif(not COMPILED, reason="the compiled kernel is not built")
def test_a_plan_is_byte_identical_with_and_without_the_compiled_path(sentencepiece_vocabularies, tmp_path, texts):
    """``--size tokens --store-tokens`` over Mistral v0.3's file at 2 ranks: the same data files and content_hash
    as with tokenizers alone; the provenance says which encoder ran."""
    path = sentencepiece_vocabularies("mistral-v3")
    data = tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"text": texts}), data, row_group_size=40)
    plans = {}
    for flag in ("1", "0"):
        out = tmp_path / f"plan{flag}"
        run_sortpack(["run", data, "-o", out, "--column", "text", "--size", "tokens", "--tokenizer", path,
                      "--max-tokens", "4096", "--oversize", "split", "--store-tokens", "--quiet"], ranks=2,
                     env={"SORTPACK_FAST_TOKENIZER": flag})
        plans[flag] = out
    one, off = read_manifest(plans["1"]), read_manifest(plans["0"])
    assert one["content_hash"] == off["content_hash"]
    assert output_files(plans["1"]) == output_files(plans["0"])
    assert one["provenance"]["tokenizers"]["mistral-v3.json"]["encoder"] == "compiled"
    assert off["provenance"]["tokenizers"]["mistral-v3.json"]["encoder"] == "tokenizers"


_INHERITED: list = []  # the encoder a fork child finds as its parent left it (not pickled: a DataLoader's fork workers)


def _encode_in_child(texts: list[str]) -> list[int]:
    return _INHERITED[0].encode_texts(texts)[0].tolist()


@pytest.mark.skipif(not COMPILED, reason="the compiled kernel is not built")
def test_a_forked_worker_encodes_after_the_parent_used_its_threads(sentencepiece_vocabularies, monkeypatch):
    """A DataLoader's fork workers inherit the encoder with its thread pool, whose threads do not survive the fork:
    a child gets a pool of its own (it queued its runs on the parent's idle threads and waited for ever)."""
    import multiprocessing

    monkeypatch.setenv("RAYON_NUM_THREADS", "2")
    enc = load_tokenizer(sentencepiece_vocabularies("mistral-v1"))
    batch = [f"hello world {i}" for i in range(64)]
    want = enc.encode_texts(batch)[0].tolist()  # through two runs on the encoder's threads
    assert enc._pool is not None
    _INHERITED[:] = [enc]
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            got = pool.apply_async(_encode_in_child, (batch,))
            try:
                assert got.get(timeout=20) == want
            finally:
                pool.terminate()
    finally:
        _INHERITED.clear()


@pytest.mark.skipif(not COMPILED, reason="the compiled kernel is not built")
@pytest.mark.parametrize("odd", [None, b"bytes", "a\ud800b", 3])
def test_what_the_compiled_path_cannot_take_fails_as_tokenizers_does(sentencepiece_vocabularies, odd):
    """encode_texts of a None, bytes, a lone surrogate or a number: tokenizers' own TypeError, as with the compiled path
    off (it was an AssertionError, Arrow's or the codec's error, and bytes were encoded as if text)."""
    enc = load_tokenizer(sentencepiece_vocabularies("mistral-v1"))
    assert enc.engine == "compiled"
    with pytest.raises(TypeError):
        enc.hf.encode_batch(["a", odd])
    with pytest.raises(TypeError):
        enc.encode_texts(["a", odd])
