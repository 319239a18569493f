"""The compiled BPE of ASCII text split by GPT-2's, Llama 3's or Qwen 2's pattern: tiktoken's ids on any ASCII
text, the rest left to the caller."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.inputs.fast_tokens import VERIFIED_PATTERNS
from sortpack.kernels import _loader, bpe

tiktoken = pytest.importorskip("tiktoken")

WORDS = ["def", "self", "return", "the", "    ", "\n    ", "  ", "==", "()", "):", "'s", "ing", "12", "000", " x",
         "\t\t", "\r\n", "__", "in", "re", "ll", "ve",
         # tokens that cross the patterns' classes, so that a piece cut elsewhere gives other ids
         "(self", ".x", "(x", ".\n", ".\n\n", "):\n", "\n\n", " \n", "\t\n", "'x", "_x", "1234", "123", "\tfoo"]


def _ranks() -> dict[bytes, int]:
    """Return a byte-level vocabulary: the 256 bytes, then the prefixes of some code words, short ones first."""
    ranks = {bytes([b]): b for b in range(256)}
    grown = sorted({w[:k].encode() for w in WORDS for k in range(2, len(w) + 1)} |
                   {(" " + w[:k]).encode() for w in WORDS for k in range(1, len(w) + 1) if not w[0].isspace()},
                   key=lambda b: (len(b), b))
    for token in grown:
        ranks.setdefault(token, len(ranks))
    return ranks


RANKS = _ranks()
ORACLES = {style: tiktoken.Encoding(style, pat_str=VERIFIED_PATTERNS[style], mergeable_ranks=RANKS, special_tokens={})
           for style in bpe.STYLES}
ORACLE = ORACLES["gpt2"]
TABLE = bpe.table(RANKS)
needs_kernels = pytest.mark.skipif(TABLE is None, reason="compiled kernels not built")

# every byte class the pattern tells apart, its contractions, and the whitespace runs around them
PARTS = st.one_of(st.text(st.characters(max_codepoint=127), max_size=6),
                  st.text(st.sampled_from(list(" \t\n\r\v\f'sStTdDmMrReEvVlL0919_(.")), max_size=8),
                  st.sampled_from(WORDS + ["'re", "'ve", "'ll", "'d", "'m", "'t", " 's", "''s", "'RE", "'Ll", "1234567",
                                           " \n\n  ", "\r\n\t", "(x", ".\n\n", " .\r\n", "\tfoo", "\v\fx"]))
ASCII = st.lists(PARTS, max_size=10).map("".join)


def _columns(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    raw = [t.encode("utf-8") for t in texts]
    offsets = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    return np.frombuffer(b"".join(raw) or b"\0", np.uint8), offsets


@needs_kernels
@pytest.mark.parametrize("style", bpe.STYLES)
def test_ids_are_tiktokens_on_any_ascii_text(style):
    @given(st.lists(ASCII, max_size=8))
    def check(texts):
        data, offsets = _columns(texts)
        ids, counts = bpe.encode_ascii(TABLE, style, data, offsets)
        want = [ORACLES[style].encode_ordinary(t) for t in texts]
        assert counts.tolist() == [len(w) for w in want]
        assert ids.tolist() == [i for w in want for i in w]
        _, only = bpe.encode_ascii(TABLE, style, data, offsets, keep=False)
        assert only.tolist() == counts.tolist()

    check()


@needs_kernels
@pytest.mark.parametrize("style", bpe.STYLES)
def test_whitespace_runs_and_contractions(style):
    texts = ["", " ", "  ", "x  ", "  x", "\n\n  def", " \t x", "\t", "a\n", "it's don't we're I've I'll 'd 'm",
             "''s ('s) 'S 'RE 'lL", " " * 300 + "y", "\r\n" * 50, "\v\f\x1c\x1f\x7f", "9" * 40 + "x", "a_b__c",
             "x = (y)\n\n    return z.\r\n", " \n \n  1", "'x '1 'S' ''"]
    data, offsets = _columns(texts)
    ids, counts = bpe.encode_ascii(TABLE, style, data, offsets)
    assert ids.tolist() == [i for t in texts for i in ORACLES[style].encode_ordinary(t)]


@needs_kernels
def test_non_ascii_and_skipped_texts_are_left_to_the_caller():
    texts = ["plain", "caf\u00e9", "", "also plain", "skip me"]
    data, offsets = _columns(texts)
    ids, counts = bpe.encode_ascii(TABLE, "gpt2", data, offsets, skip=np.array([0, 0, 0, 0, 1], np.uint8))
    assert counts.tolist() == [len(ORACLE.encode_ordinary("plain")), -1, 0,
                               len(ORACLE.encode_ordinary("also plain")), -1]
    assert ids.tolist() == ORACLE.encode_ordinary("plain") + ORACLE.encode_ordinary("also plain")


@needs_kernels
def test_a_vocabulary_that_is_not_byte_level_or_repeats_a_token_is_refused():
    partial = {b"a": 0, b"b": 1, b"ab": 2}
    data, offsets = _columns(["ab ab"])
    assert bpe.encode_ascii(bpe.table(partial), "gpt2", data, offsets) is None  # b" " is no token
    assert bpe.table({b"a": 0, b"b": 1}) is not None
    assert bpe._c().sp_bpe_new(None, np.array([0], np.int64).ctypes.data, None, 0) != 0  # empty table: made
    blob = np.frombuffer(b"aa", np.uint8)
    twice = bpe._c().sp_bpe_new(blob.ctypes.data, np.array([0, 1, 2], np.int64).ctypes.data,
                                np.array([0, 1], np.int64).ctypes.data, 2)
    assert twice is None  # one token twice: no table


def test_without_the_compiled_kernels_there_is_no_table(monkeypatch):
    monkeypatch.setattr(_loader, "_clib", None)
    monkeypatch.setattr(_loader, "_warned", True)
    assert bpe.table(RANKS) is None
