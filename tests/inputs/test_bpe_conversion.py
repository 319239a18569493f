"""The conversion's proof, alone: ``exact_conversion`` accepts a tokenizer.json only where tiktoken's rank rule (and the
compiled BPE, which follows it) gives the file's ids, and says why it refuses the others.

Property tests draw vocabularies as converters from tiktoken's files write them (every two-token split a merge,
``ignore_merges``, tokens reachable only whole) and as ``tokenizers`` trains them (one merge a token, some drawn out
of order): wherever the conversion is accepted, tiktoken's ids and the kernel's are ``Tokenizer.encode``'s.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
tiktoken = pytest.importorskip("tiktoken")

from hypothesis import given
from hypothesis import strategies as st
from tokenizer_fixtures import hf_reference

from benchmarks.real_vocab import VARIANTS, tokenizer_json
from sortpack.inputs.bpe_conversion import Refused, byte_chars, exact_conversion, load_spec
from sortpack.kernels import bpe

ALPHABET = "abc '\n"
TEXTS = st.lists(st.text(st.sampled_from(list(ALPHABET + "<|>")), max_size=40), min_size=1, max_size=5)
SPELL = {b: c for c, b in byte_chars().items()}


def _loaded(spec: dict):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps(spec))


def _agree(spec: dict, texts: list[str]) -> bool:
    """Return whether the conversion is accepted; when it is, assert its ids are the loaded file's on ``texts``."""
    hf = _loaded(spec)
    try:
        conv = exact_conversion(spec, hf)
    except Refused:
        return False
    enc = tiktoken.Encoding("t", pat_str=conv.pattern, mergeable_ranks=conv.ranks, special_tokens=conv.special)
    want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    assert [enc.encode(t, allowed_special="all") for t in texts] == want
    tab = bpe.table(conv.ranks)
    plain = [t for t in texts if not any(s in t for s in conv.special)]
    if tab is not None and conv.style in bpe.STYLES and plain:
        raw = [t.encode() for t in plain]
        ids, counts = bpe.encode(tab, conv.style, (np.frombuffer(b"".join(raw) or b"\0", np.uint8),
                                                   np.concatenate(([0], np.cumsum([len(r) for r in raw])))))
        assert ids.tolist() == [i for t in plain for i in hf.encode(t, add_special_tokens=False).ids]
    return True


@st.composite
def tiktoken_files(draw) -> dict[bytes, int]:
    """A rank file as tiktoken's are: the 256 bytes, then drawn tokens of a few characters in a drawn order."""
    tokens = draw(st.lists(st.text(st.sampled_from(list(ALPHABET)), min_size=2, max_size=6), max_size=40, unique=True))
    ranks = {bytes([b]): b for b in range(256)}
    for t in tokens:
        ranks.setdefault(t.encode(), len(ranks))
    return ranks


def test_files_converted_from_tiktoken_are_accepted_with_their_ids():
    """Every two-token split a merge, grouped by rank (Llama 3's file is one): accepted with or without
    ``ignore_merges``, whatever tokens are reachable only whole or made by several merges, and the ids agree."""
    @given(tiktoken_files(), st.sampled_from(["gpt2", "llama3", "qwen2"]), st.booleans(), TEXTS)
    def check(ranks, style, ignore, texts):
        assert _agree(tokenizer_json(ranks, style, ignore), texts)

    check()


@st.composite
def trained_files(draw) -> tuple[dict, bool, list[str]]:
    """A tokenizers-style file (each merge joins two tokens into a new one; one merge drawn out of its place or not),
    and texts made of its tokens (where merges compete)."""
    spec = tokenizer_json({bytes([b]): b for b in range(256)}, draw(st.sampled_from(["gpt2", "llama3"])),
                          draw(st.booleans()))
    vocab, merges = spec["model"]["vocab"], []
    known = list("abc")
    for _ in range(draw(st.integers(0, 25))):
        a, b = draw(st.sampled_from(known)), draw(st.sampled_from(known))
        if a + b not in vocab:  # a trainer makes each token once
            vocab[a + b] = len(vocab)
            known.append(a + b)
            merges.append([a, b])
    moved = draw(st.booleans()) and len(merges) > 1
    if moved:
        k = draw(st.integers(0, len(merges) - 1))
        merges.insert(draw(st.integers(0, len(merges) - 1)), merges.pop(k))
    spec["model"]["merges"] = merges
    for k, added in enumerate(spec["added_tokens"]):
        added["id"] = len(vocab) + k
    spec["post_processor"] = None
    words = st.lists(st.sampled_from(known), max_size=8).map("".join)
    texts = draw(st.lists(st.lists(st.one_of(words, st.sampled_from([" ", "'", "\n"])), max_size=4).map("".join),
                          min_size=1, max_size=4))
    return spec, moved, texts


def test_trained_files_agree_whenever_accepted():
    @given(trained_files())
    def check(drawn):
        spec, moved, texts = drawn
        accepted = _agree(spec, texts)
        assert accepted or moved or spec["model"]["ignore_merges"], "an in-order trained file is always exact"

    check()


def _abc_file(ignore_merges: bool) -> dict:
    """Return a file where "abc" is a token no merge makes while "ab" and "c", which merges make, join into it."""
    spec = tokenizer_json({bytes([b]): b for b in range(256)} | {b"ab": 256, b"bc": 257, b"abc": 258}, "gpt2",
                          ignore_merges)
    spec["model"]["merges"] = [["a", "b"], ["b", "c"]]
    return spec


def test_a_token_two_tokens_would_join_into_is_refused_with_ignore_merges():
    """tiktoken joins "ab" and "c" (its ranks must hold "abc" for the whole-word lookup); the file never does."""
    spec = _abc_file(ignore_merges=True)
    hf = _loaded(spec)
    with pytest.raises(Refused, match="ignore_merges, and the token 'abc' is not what the merges make"):
        exact_conversion(spec, hf)
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"bc": 257, b"abc": 258}
    rule = tiktoken.Encoding("rule", pat_str=r"\w+|\s+|.", mergeable_ranks=ranks, special_tokens={})
    assert hf.encode("abcabc", add_special_tokens=False).ids == [256, 99, 256, 99]
    assert rule.encode_ordinary("abcabc") == [258, 258]  # the refusal is needed: the rule would differ
    assert hf.encode("abc", add_special_tokens=False).ids == [258]  # taken whole
    plain = exact_conversion(_abc_file(ignore_merges=False), _loaded(_abc_file(ignore_merges=False)))
    assert b"abc" not in plain.ranks  # without ignore_merges "abc" never comes out: no rank, nothing joins into it


def test_tokens_made_by_several_merges_use_the_one_their_own_bytes_use_last():
    """ "abc" is made by (ab, c) and (a, bc): only the merge BPE("abc") makes last can ever join two parts."""
    spec = tokenizer_json({bytes([b]): b for b in range(256)} | {b"ab": 256, b"bc": 257, b"abc": 258}, "gpt2", False)
    assert [m for m in spec["model"]["merges"] if "".join(m) == "abc"] == [["a", "bc"], ["ab", "c"]]
    assert _agree(spec, ["abc", "abcabc bcab", "aabbcc abcbc"])
    spec["model"]["merges"].insert(0, spec["model"]["merges"].pop())  # (ab, c) before (a, b): out of order
    with pytest.raises(Refused, match="not in the order of the merges"):
        exact_conversion(spec, _loaded(spec))


# --- conversions refused, with their reasons ---------------------------------------------------------------
def _edited(path: str, tmp_path: Path, edit) -> str:
    spec = json.loads(Path(path).read_text())
    edit(spec)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(spec))
    return str(out)


def _permute_ids(spec: dict) -> None:
    vocab = spec["model"]["vocab"]
    a, b = spec["model"]["merges"][10], spec["model"]["merges"][500]
    ta, tb = "".join(a if isinstance(a, list) else a.split(" ")), "".join(b if isinstance(b, list) else b.split(" "))
    vocab[ta], vocab[tb] = vocab[tb], vocab[ta]


def _drop_byte(spec: dict) -> None:
    vocab = spec["model"]["vocab"]
    del vocab["\u0100"]  # the byte 0x00's character; no merge uses it


REFUSALS = {
    "the tokenizer has a normalizer": lambda s: s.update(normalizer={"type": "NFC"}),
    "adds a prefix space": lambda s: s["pre_tokenizer"].update(add_prefix_space=True),
    "not one verified": lambda s: s.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\w+|\s+|."}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}),
    "byte_fallback": lambda s: s["model"].update(byte_fallback=True),
    "dropout": lambda s: s["model"].update(dropout=0.1),
    "strips": lambda s: s["added_tokens"][0].update(lstrip=True),
    "is part of another": lambda s: s["added_tokens"].append({**s["added_tokens"][0], "id": 2999,
                                                              "content": "<|endoftext|>x"}),
    "ends as another begins": lambda s: s["added_tokens"].append({**s["added_tokens"][0], "id": 2999,
                                                                  "content": "x<|end"}),
    "not in the order of the merges": _permute_ids,
    "lacks some of the 256": _drop_byte,
    "post-processor is not one": lambda s: s.update(post_processor={"type": "Custom"}),
    "model is not BPE": lambda s: s["model"].update(type="WordPiece"),
}


@pytest.mark.parametrize("why", sorted(REFUSALS))
def test_conversions_that_would_not_be_exact_are_refused(tokenizers_by_style, tmp_path, why):
    from tokenizer_fixtures import fast_lists

    from sortpack.inputs.specs import load_tokenizer

    path = _edited(tokenizers_by_style["gpt2"], tmp_path, REFUSALS[why])
    from tokenizers import Tokenizer

    try:
        hf = Tokenizer.from_file(path)
    except Exception:  # noqa: BLE001 - an edit tokenizers itself refuses: check the decision alone
        hf = None
    with pytest.raises(Refused, match=why):
        exact_conversion(load_spec(path), hf)
    if hf is not None:  # the fallback still counts (with the file's own tokenizers ids)
        enc = load_tokenizer(path)
        assert enc.engine == "tokenizers" and why in enc.reason
        texts = ["hello <|endoftext|> world", "x = 1\n"]
        if why != "dropout":  # dropout's ids are random
            assert fast_lists(enc, texts, True) == hf_reference(path, texts, True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_real_vocabularies_from_a_registry_package_are_accepted(real_vocabularies, name):
    """openai-whisper's GPT-2 and multilingual rank files, written as converters write them (with Llama 3's,
    Qwen 2's and GPT-2's patterns and ignore_merges): the fast path, whatever tokens are reachable only whole."""
    path = real_vocabularies(name)
    spec = load_spec(path)
    conv = exact_conversion(spec, _loaded(spec))
    assert conv.style == VARIANTS[name][1] and len(conv.ranks) >= 50_000
