"""The compiled SentencePiece-style BPE (kernels.sp_bpe) against Hugging Face tokenizers on random vocabularies."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sortpack.kernels import sp_bpe

pytest.importorskip("tokenizers")

ALPHABET = ["a", "b", "c", "\u2581", "é", "日", "😀"]
TEXT_CHARS = ALPHABET + [" ", "\n", "x", "\u3000"]  # x and the ideographic space are in no vocabulary: byte fallback
SHAPES = ("prepend", "replace", "metaspace-first", "metaspace-always", "metaspace-never")


def _tokenizer(singles: list[str], merges: list[tuple[str, str]], shape: str):
    """Return a tokenizers Tokenizer of the characters ``singles``, the 256 byte tokens and ``merges`` in ``shape``."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in singles:
        vocab.setdefault(c, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if shape == "prepend":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    elif shape == "replace":
        tok.normalizer = normalizers.Replace(" ", "\u2581")
    else:
        scheme = shape.rpartition("-")[2]
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=False)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")])
    return tok


@st.composite
def vocabularies(draw):
    """Draw (single characters, merges in rank order, shape): merges join tokens made so far, now and then a byte
    token (then no cut between words is known and a text merges whole)."""
    singles = draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=len(ALPHABET), unique=True))
    tokens = list(singles)
    merges: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, 40))):
        pool = tokens + (["<0x0A>", "<0x78>"] if draw(st.integers(0, 9)) == 0 else [])
        a, b = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
        if (a, b) not in merges:
            merges.append((a, b))
            tokens.append(a + b)
    return singles, merges, draw(st.sampled_from(SHAPES))


texts = st.lists(st.one_of(st.text(st.sampled_from(TEXT_CHARS), max_size=30),
                           st.text(st.sampled_from(TEXT_CHARS[:3]), min_size=40, max_size=300)),
                 min_size=1, max_size=12)


def _ours(tab, batch: list[str]) -> list[list[int]]:
    raw = [t.encode("utf-8") for t in batch]
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in raw]))).astype(np.int64)
    ids, counts = sp_bpe.encode(tab, (np.frombuffer(b"".join(raw) or b"\0", np.uint8), offsets))
    _, only = sp_bpe.encode(tab, (np.frombuffer(b"".join(raw) or b"\0", np.uint8), offsets), keep=False)
    assert only.tolist() == counts.tolist()
    return [a.tolist() for a in np.split(ids, np.cumsum(counts)[:-1])]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocabularies(), texts)
def test_the_kernel_gives_the_ids_of_tokenizers(vocab, batch):
    """Every text, short words through the rescan, long ones (a run of merging characters) through the heap, with
    and without the cuts between words: the ids of the file's own tokenizers."""
    from sortpack.inputs.sp_conversion import sp_conversion

    singles, merges, shape = vocab
    tok = _tokenizer(singles, merges, shape)
    conv = sp_conversion(json.loads(tok.to_str()), tok)
    tab = conv.compiled()
    if tab is None:
        pytest.skip(f"the compiled kernel is unavailable ({sp_bpe.unavailable})")
    assert _ours(tab, batch) == [e.ids for e in tok.encode_batch(batch, add_special_tokens=False)]


def test_a_long_run_merges_through_the_heap_in_linear_time_per_merge():
    """A 200,000-character run of one merging character (one word of 200,001 symbols): the same ids as tokenizers,
    in well under its time."""
    import time

    from sortpack.inputs.sp_conversion import sp_conversion

    merges = [("a", "a"), ("aa", "aa"), ("aaaa", "aaaa"), ("\u2581", "a")]
    tok = _tokenizer(["a", "\u2581"], merges, "prepend")
    tab = sp_conversion(json.loads(tok.to_str()), tok).compiled()
    if tab is None:
        pytest.skip("the compiled kernel is unavailable")
    text = "a" * 200_000
    start = time.perf_counter()
    mine = _ours(tab, [text])[0]
    ours = time.perf_counter() - start
    start = time.perf_counter()
    theirs = tok.encode(text, add_special_tokens=False).ids
    reference = time.perf_counter() - start
    assert mine == theirs
    assert ours < max(reference, 0.05) * 2


def test_cuts_between_words_are_only_where_no_token_joins_the_two_characters():
    """The pairs the table is given: those inside some made token, no pair across two tokens."""
    keys = sp_bpe.bigrams_of(["\u2581the", "he", "x"])
    pairs = {(chr(int(k) >> 21), chr(int(k) & 0x1FFFFF)) for k in keys}
    assert pairs == {("\u2581", "t"), ("t", "h"), ("h", "e")}


@pytest.mark.parametrize("shape", ["prepend", "metaspace-always"])
@pytest.mark.parametrize("replacement", ["\U0001F600", "\u00e9", "\u2581"])
def test_a_space_replacement_with_no_token_fits_the_buffers_however_wide(replacement, shape):
    """A replacement that is no token becomes its UTF-8 bytes' fallback ids, up to four per space (and four more in
    front): the kernel's scratch and the id buffer hold them (a four-byte one overran both, sized three per byte)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from sortpack.inputs.sp_conversion import sp_conversion

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": b + 1 for b in range(256)}, "a": 257}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    if shape == "prepend":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(replacement), normalizers.Replace(" ", replacement)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=replacement, prepend_scheme="always", split=False)
    tab = sp_conversion(json.loads(tok.to_str()), tok).compiled()
    if tab is None:
        pytest.skip("the compiled kernel is unavailable")
    batch = [" ", " " * 10, " " * 5000, "a" + " " * 300, "", "a"]
    assert _ours(tab, batch) == [e.ids for e in tok.encode_batch(batch, add_special_tokens=False)]


def test_a_merge_that_makes_a_token_holding_nul_keeps_its_pairs_uncut():
    """U+0000 is a character like any other: a made token may hold it, so the pairs beside it are no cut (the tokens
    were joined with NUL and every pair touching one dropped, which cut 'a' from '\\x00' and split their merge)."""
    from tokenizers import Tokenizer, models, normalizers

    from sortpack.inputs.sp_conversion import sp_conversion

    pairs = {(chr(int(k) >> 21), chr(int(k) & 0x1FFFFF)) for k in sp_bpe.bigrams_of(["a\x00", "\x00b"])}
    assert pairs == {("a", "\x00"), ("\x00", "b")}
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": b + 1 for b in range(256)}, "a": 257, "\x00": 258, "b": 259, "\u2581": 260}
    merges = [("a", "\x00"), ("\x00", "b"), ("\u2581", "a\x00")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tab = sp_conversion(json.loads(tok.to_str()), tok).compiled()
    if tab is None:
        pytest.skip("the compiled kernel is unavailable")
    batch = ["a\x00", "\x00b", "a\x00b a\x00 \x00b", "\x00"]
    assert _ours(tab, batch) == [e.ids for e in tok.encode_batch(batch, add_special_tokens=False)]
