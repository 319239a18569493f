"""The fast tokenizer path gives exactly ``Tokenizer.encode``'s ids, or is not taken.

Tokenizers trained here on the standard library (``tests/tokenizer_fixtures.py``) and real vocabularies from a
registry package (openai-whisper's rank files, with GPT-2's, Llama 3's and Qwen 2's patterns) against
Hugging Face ``tokenizers``: real code and real text in many languages, every code point in several contexts,
the added tokens, whitespace runs, empty and long texts, and hypothesis' strings, through tiktoken
(``encode_texts``) and through the compiled path over Arrow columns (``token_ids``).
"""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("tiktoken")

from hypothesis import given
from hypothesis import strategies as st
from tokenizer_fixtures import (
    EDGE,
    SPECIALS,
    STYLES,
    class_points,
    code_point_texts,
    column_lists,
    fast_lists,
    hf_reference,
    swept_points,
    train,
)

from benchmarks.real_vocab import VARIANTS, mixed_texts
from sortpack.inputs import fast_tokens
from sortpack.inputs.bpe_conversion import VERIFIED_PATTERNS
from sortpack.inputs.fast_tokens import TokenEncoder, token_ids
from sortpack.inputs.specs import evaluate, load_tokenizer, parse_spec
from sortpack.kernels import bpe

from support import ROOT, output_files, read_manifest, run_sortpack

COMPILED = bpe.table({b"a": 0}) is not None  # the compiled BPE is built here


def assert_same(path: str, texts: list[str], columns: bool = False) -> None:
    """Assert the fast path's ids (``encode_texts``, or ``token_ids`` over a column) are the file's, with and
    without the special tokens."""
    enc = load_tokenizer(path)
    assert enc.engine == "tiktoken", enc.reason
    for special in (True, False):
        want = hf_reference(path, texts, special)
        got = column_lists(enc, texts, special)[0] if columns else fast_lists(enc, texts, special)
        for text, a, b in zip(texts, want, got):
            assert a == b, f"{path}: {text[:60]!r}"
        assert len(got) == len(want)


@pytest.mark.parametrize("style", STYLES)
def test_trained_styles_take_tiktoken_and_give_the_same_ids_on_real_code(tokenizers_by_style, sources, style):
    assert_same(tokenizers_by_style[style], sources[:10] + EDGE)


@pytest.mark.parametrize("style", ["gpt2", pytest.param("llama3", marks=pytest.mark.slow)])
def test_a_tokenizer_without_added_tokens(tmp_path, sources, style):
    """No added tokens: tiktoken's plain encode (its special-token search would look for an empty pattern)."""
    path = train(tmp_path / "plain.json", style, sources, vocab=1500, added=False)
    assert_same(path, sources[:10] + EDGE)
    assert_same(path, sources[:10] + EDGE, columns=True)


@pytest.mark.parametrize("style", STYLES)
def test_every_code_point_class_in_context(tokenizers_by_style, style):
    # a few code points of every general category and every 499th code point, through tiktoken and the columns
    texts = code_point_texts(sorted(set(class_points()) | set(range(0, 0x110000, 499))))
    assert_same(tokenizers_by_style[style], texts, columns=style in bpe.STYLES)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", sorted(VERIFIED_PATTERNS))
def test_both_regex_engines_split_every_code_point_alike(name):
    """The two engines' pieces, seen through an encoding whose only tokens are the pieces tokenizers' regex cut.

    Each piece is a token of its own, so tiktoken gives the expected ids exactly when its regex
    cuts the same pieces (a piece it cuts otherwise is not a token and comes out in smaller ones);
    the compiled BPE likewise, for the patterns it splits by.
    """
    import numpy as np
    import tiktoken
    from tokenizers import Regex, pre_tokenizers

    pattern = VERIFIED_PATTERNS[name]
    split = pre_tokenizers.Split(Regex(pattern), "isolated")
    for text in code_point_texts(swept_points()):
        pieces = [p.encode("utf-8") for p, _ in split.pre_tokenize_str(text)]
        assert b"".join(pieces) == text.encode("utf-8")  # the matches cover the text: tiktoken keeps only matches
        ranks = {bytes([b]): b for b in range(256)}
        for p in pieces:
            ranks.setdefault(p, len(ranks))
        want = [ranks[p] for p in pieces]
        enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        assert enc.encode_ordinary(text) == want
        tab = bpe.table(ranks)
        if tab is not None and name in bpe.STYLES:
            raw = text.encode("utf-8")
            assert bpe.encode(tab, name, (np.frombuffer(raw, np.uint8), np.array([0, len(raw)])))[0].tolist() == want


CHARS = st.one_of(st.characters(blacklist_categories=("Cs",)),
                  st.sampled_from(list(" \t\n\r\u00a0\u3000'sSdlLtvVmMrReE019ſé日")))
TEXT = st.lists(st.one_of(st.text(CHARS, max_size=30), st.sampled_from(SPECIALS)), max_size=6).map("".join)


@pytest.mark.parametrize("style", STYLES)
def test_random_text_property(tokenizers_by_style, style):
    """Hypothesis' strings of any code points and the added tokens, through tiktoken and (where the kernel splits by
    the pattern) the compiled column path."""
    from tokenizers import Tokenizer

    path = tokenizers_by_style[style]
    enc, hf = load_tokenizer(path), Tokenizer.from_file(path)

    @given(st.lists(TEXT, min_size=1, max_size=6), st.booleans())
    def check(texts, special):
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
        assert fast_lists(enc, texts, special) == want
        assert column_lists(enc, texts, special, chunks=1)[0] == want

    check()


def test_threads_give_the_same_ids(tokenizers_by_style, sources, monkeypatch):
    path = tokenizers_by_style["qwen2"]
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    assert fast_lists(load_tokenizer(path), sources[:15], True) == hf_reference(path, sources[:15], True)


def test_counts_and_ids_of_a_column_match_the_reference(tokenizers_by_style, sources):
    path = tokenizers_by_style["llama3"]
    col = pa.chunked_array([sources[:4], [], sources[4:10]], pa.large_string())
    spec = parse_spec("tokens", "text", "--size")
    want = hf_reference(path, sources[:10], True)
    sizes = evaluate(spec, pa.table({"text": col}), "x", tokenizer=load_tokenizer(path))
    assert sizes.tolist() == [len(w) for w in want]
    ids, counts = token_ids(load_tokenizer(path), col)
    assert ids.to_pylist() == want and counts.tolist() == [len(w) for w in want]
    from tokenizers import Tokenizer

    bare_ids, _ = token_ids(Tokenizer.from_file(path), col)  # a plain tokenizers.Tokenizer still works
    assert bare_ids.to_pylist() == want


@pytest.mark.parametrize("style", ["gpt2", "llama3", "qwen2"])
def test_every_text_of_the_compiled_styles_skips_tiktoken(tokenizers_by_style, sources, style, monkeypatch):
    """GPT-2's, Llama 3's and Qwen 2's patterns: every text, ASCII or not, through kernels.bpe; only those holding an
    added token's text through tiktoken, spliced back in order: the ids of ``Tokenizer.encode`` either way."""
    path = tokenizers_by_style[style]
    enc = load_tokenizer(path)
    if not COMPILED:
        pytest.skip("compiled BPE not built")
    assert enc.record()["compiled"] == "utf-8"
    plain = sources[:10] + [t for t in EDGE if not any(s in t for s in SPECIALS)] + ["café", "日本語 x", ""]
    holding = ["x<tool>y", "<|im_start|> a", "é<|endoftext|>"]
    sent: list[list[str]] = []
    monkeypatch.setattr(TokenEncoder, "_encode_run", lambda self, texts, run=TokenEncoder._encode_run: (
        sent.append(texts), run(self, texts))[1])
    texts = plain[:6] + holding[:1] + plain[6:] + holding[1:]
    for special in (True, False):
        ids, counts = column_lists(enc, texts, special)
        want = hf_reference(path, texts, special)
        assert ids == want and counts == [len(w) for w in want]
    assert {t for run in sent for t in run} == set(holding)


@pytest.mark.parametrize("style", ["gpt2", "llama3", "qwen2"])
def test_random_columns_property(tokenizers_by_style, style):
    """Hypothesis' strings (every class, contractions, whitespace runs, other scripts, added tokens) as columns."""
    from tokenizers import Tokenizer

    path = tokenizers_by_style[style]
    enc, hf = load_tokenizer(path), Tokenizer.from_file(path)
    text = st.lists(st.one_of(st.text(st.characters(max_codepoint=127), max_size=12),
                              st.text(st.sampled_from(list(" \t\n\r\v\f'sSdlLmtrReEv09x_(.ſé日\u3000\u00a0²\u0301")),
                                      max_size=10),
                              st.sampled_from(SPECIALS)), max_size=6).map("".join)

    @given(st.lists(text, min_size=1, max_size=8), st.booleans())
    def check(texts, special):
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
        assert column_lists(enc, texts, special, chunks=1)[0] == want

    check()


def test_the_compiled_path_in_threads_gives_the_same_ids(tokenizers_by_style, sources, monkeypatch):
    path = tokenizers_by_style["gpt2"]
    texts = sources[:15] + EDGE
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")
    one = column_lists(load_tokenizer(path), texts, True, chunks=2)
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    assert column_lists(load_tokenizer(path), texts, True, chunks=2) == one
    assert one[0] == hf_reference(path, texts, True)
    monkeypatch.setattr("sortpack.inputs.token_columns.RUN_BYTES", 997)  # many runs per chunk, some of one text
    assert column_lists(load_tokenizer(path), texts, True, chunks=2) == one


def test_one_conversion_and_one_table_for_every_encoder_and_thread(tokenizers_by_style):
    """The compiled table is the conversion's (made once, under its lock), shared by the encoders of one file."""
    from concurrent.futures import ThreadPoolExecutor

    path = tokenizers_by_style["qwen2"]
    with ThreadPoolExecutor(4) as pool:
        encoders = list(pool.map(lambda _: load_tokenizer(path), range(8)))
    tables = {id(e.compiled[0]) for e in encoders if e.compiled is not None}
    assert len(tables) <= 1
    assert len({id(e._fast) for e in encoders}) == 1


def test_texts_beyond_ascii_go_to_tiktoken_where_tokenizers_has_other_classes(tmp_path, sources, monkeypatch):
    """A tokenizers whose Unicode tables are not the committed ones: the compiled path takes ASCII texts only, says
    why, and the ids stay the file's."""
    from sortpack.kernels import unicode_classes

    path = train(tmp_path / "other.json", "llama3", sources[:10], vocab=800)
    monkeypatch.setattr(unicode_classes, "same_as_tokenizers", lambda: "tokenizers 9.9 classes U+1C89 otherwise")
    monkeypatch.setattr(fast_tokens, "_MEMO", {})
    enc = load_tokenizer(path)
    if not COMPILED:
        pytest.skip("compiled BPE not built")
    assert enc.record()["compiled"] == "ascii" and "U+1C89" in enc.record()["why_ascii"]
    texts = sources[:5] + EDGE
    assert column_lists(enc, texts, True)[0] == hf_reference(path, texts, True)


def test_tiktoken_alone_is_a_switch_and_gives_the_same_ids(tokenizers_by_style, sources, monkeypatch):
    path = tokenizers_by_style["gpt2"]
    texts = sources[:10] + EDGE
    default = column_lists(load_tokenizer(path), texts, True)
    monkeypatch.setenv("SORTPACK_FAST_TOKENIZER", "tiktoken")
    enc = load_tokenizer(path)
    assert enc.engine == "tiktoken" and "compiled" not in enc.record()
    assert column_lists(enc, texts, True) == default
    monkeypatch.delenv("SORTPACK_FAST_TOKENIZER")
    tekken = load_tokenizer(tokenizers_by_style["tekken"])  # a pattern the kernel does not split by: tiktoken alone
    assert tekken.engine == "tiktoken" and "compiled" not in tekken.record()


def test_the_switch_and_a_missing_tiktoken_fall_back(tokenizers_by_style, monkeypatch):
    path = tokenizers_by_style["gpt2"]
    monkeypatch.setenv("SORTPACK_FAST_TOKENIZER", "0")
    enc = load_tokenizer(path)
    assert enc.engine == "tokenizers" and enc.record()["why"] == "SORTPACK_FAST_TOKENIZER=0"
    monkeypatch.delenv("SORTPACK_FAST_TOKENIZER")
    monkeypatch.setattr("sortpack.inputs.fast_tokens._tiktoken_version", lambda: None)
    enc = load_tokenizer(path)
    assert enc.engine == "tokenizers" and "tiktoken is not installed" in enc.reason


def test_tiktoken_s_version_is_its_metadata_s_read_without_importlib_metadata():
    # the provenance names tiktoken's version: importlib.metadata gives it after loading the email parser and scanning
    # every distribution on sys.path (about 15 ms of CPU a rank each job); the wheel's .dist-info folder names it
    import subprocess
    import sys
    from importlib.metadata import version

    from sortpack.inputs.fast_tokens import _tiktoken_version

    pytest.importorskip("tiktoken")
    assert _tiktoken_version() == version("tiktoken")
    probe = ("import sys; from sortpack.inputs.fast_tokens import _tiktoken_version as v; print(v()); "
             "assert 'importlib.metadata' not in sys.modules, 'importlib.metadata imported'")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() == version("tiktoken"), proc.stderr


def test_a_loaded_encoder_pickles_for_worker_processes(tokenizers_by_style, sources):
    import pickle

    for path in (tokenizers_by_style["gpt2"], tokenizers_by_style["llama3"]):
        enc = load_tokenizer(path)
        enc.encode_texts(sources[:4])  # its thread pool exists now and is not sent
        back = pickle.loads(pickle.dumps(enc))
        assert back.engine == enc.engine
        assert fast_lists(back, sources[:20], True) == fast_lists(enc, sources[:20], True)


# --- real vocabularies and real text ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed() -> list[str]:
    """Real documents in many languages from this machine (gettext catalogs, the standard library), a quarter or more
    of them beyond ASCII."""
    docs = mixed_texts(240, longest=4000)
    if sum(any(ord(c) > 127 for c in d) for d in docs) < max(len(docs) // 4, 20):
        pytest.skip("too little text beyond ASCII on this machine")
    return docs


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_real_vocabularies_give_the_files_ids_on_mixed_language_text(real_vocabularies, mixed, name):
    """openai-whisper's GPT-2 and multilingual vocabularies (as Llama 3-, Qwen 2- and GPT-2-style files, with
    ignore_merges): the compiled path over every text, ids equal to ``tokenizers``' on real multilingual text."""
    path = real_vocabularies(name)
    enc = load_tokenizer(path)
    assert enc.engine == "tiktoken", enc.reason
    if COMPILED:
        assert enc.record()["compiled"] == "utf-8"
    texts = mixed + EDGE
    for special in (True, False):
        want = hf_reference(path, texts, special)
        ids, counts = column_lists(enc, texts, special)
        assert counts == [len(w) for w in want]
        assert ids == want
    assert fast_lists(enc, texts[:100], True) == hf_reference(path, texts[:100], True)


@pytest.mark.slow
@pytest.mark.parametrize("style", ["llama3", "gpt2"])
def test_plans_are_byte_identical_whichever_encoder_ran(tokenizers_by_style, sources, tmp_path, style):
    """Same data files and content_hash with tiktoken (and its compiled path) and with tokenizers; provenance says
    which ran."""
    path = tokenizers_by_style[style]
    data = tmp_path / "code.parquet"
    pq.write_table(pa.table({"text": sources + EDGE}), data, row_group_size=20)
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
    assert one["provenance"]["tokenizers"][f"{style}.json"]["encoder"] == "tiktoken"
    assert off["provenance"]["tokenizers"][f"{style}.json"]["encoder"] == "tokenizers"
    if COMPILED:
        assert one["provenance"]["tokenizers"][f"{style}.json"]["compiled"] == "utf-8"
