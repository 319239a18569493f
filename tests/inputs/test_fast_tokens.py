"""The fast tokenizer path gives exactly ``Tokenizer.encode``'s ids, or is not taken.

Byte-level BPEs are trained here on the Python standard library's source (nothing is
downloaded) with the pre-tokenizers of GPT-2 (ByteLevel's own regex), Llama 3 (Split regex,
``ignore_merges``, a BOS template), Qwen 2 and Mistral-Nemo (tekken), and compared with
tiktoken's encoding of the same texts: real code, every code point in several contexts, the
added tokens, whitespace runs, empty and long texts, and hypothesis' strings.
"""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("tiktoken")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sortpack.inputs.bpe_conversion import VERIFIED_PATTERNS, Refused, exact_conversion, load_spec
from sortpack.inputs.fast_tokens import TokenEncoder, token_ids
from sortpack.inputs.specs import evaluate, load_tokenizer, parse_spec
from sortpack.kernels import backend

from support import output_files, read_manifest, run_sortpack

SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<tool>"]


def _stdlib_sources(files: int) -> list[str]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in lib.glob("*.py"))[:files]
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]


@pytest.fixture(scope="module")
def sources() -> list[str]:
    """The first standard-library modules' sources (real code: identifiers, strings, comments, whitespace)."""
    return _stdlib_sources(40)


def train(path: Path, style: str, texts: list[str], vocab: int = 3000, added: bool = True) -> str:
    """Train a byte-level BPE with ``style``'s pre-tokenizer (and Llama 3's ignore_merges and BOS) and save it.

    ``added=False``: no added tokens and no post-processor (as benchmarks/bench_scaling.py trains one).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(VERIFIED_PATTERNS[style]), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIALS[:2] if added else [], show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    if not added:
        tok.save(str(path))
        return str(path)
    tok.add_tokens(SPECIALS[3:])  # a non-special added token, split out first too
    tok.add_special_tokens(SPECIALS[2:3])
    if style == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])])
    elif style == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
    else:
        eos = tok.token_to_id("<|endoftext|>")
        tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>",
                                                           special_tokens=[("<|endoftext|>", eos)])
    tok.save(str(path))
    return str(path)


STYLES = ["gpt2", "llama3", "qwen2", "tekken"]


@pytest.fixture(scope="module")
def tokenizers_by_style(tmp_path_factory, sources) -> dict[str, str]:
    """One trained tokenizer.json per style."""
    work = tmp_path_factory.mktemp("fasttok")
    return {s: train(work / f"{s}.json", s, sources) for s in STYLES}


def hf_reference(path: str, texts: list[str], special: bool) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=special)]


def fast_lists(enc: TokenEncoder, texts: list[str], special: bool) -> list[list[int]]:
    ids, counts = enc.encode_texts(texts, special)
    assert ids.dtype == np.int32 and counts.dtype == np.int64
    return [a.tolist() for a in np.split(ids, np.cumsum(counts)[:-1])] if len(texts) else []


def assert_same(path: str, texts: list[str]) -> None:
    enc = load_tokenizer(path)
    assert enc.engine == "tiktoken", enc.reason
    for special in (True, False):
        want, got = hf_reference(path, texts, special), fast_lists(enc, texts, special)
        for text, a, b in zip(texts, want, got):
            assert a == b, f"{Path(path).stem}: {text[:60]!r}"
        assert len(got) == len(want)


EDGE = ["", " ", "\n", "  \n\n\t  x", "x" * 5000, " " * 3000, "\r\n" * 500, "9" * 1000, "é" * 700,
        "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|im_start|>user\nhi<tool> x",
        "<|begin_of_text|>", "<|endoftext", "endoftext|>", "'s 'S 'll 'LL 'ſ", "don't WE'RE", "\u3000\u00a0\u2028x",
        "😀👍🏽 emoji", "日本語のテキスト", "ﷺ ﷽", "x\u0301\u0308", "\U0010fffd\U000e0001", "tab\tsep\vend\f"]


@pytest.mark.parametrize("style", STYLES)
def test_trained_styles_take_tiktoken_and_give_the_same_ids_on_real_code(tokenizers_by_style, sources, style):
    assert_same(tokenizers_by_style[style], sources[:20] + EDGE)


def class_points() -> list[int]:
    """Return the first and last code point of every Unicode general category (this Python's tables), unassigned too."""
    import unicodedata

    seen: dict[str, list[int]] = {}
    for c in range(0x110000):
        if not 0xD800 <= c <= 0xDFFF:
            seen.setdefault(unicodedata.category(chr(c)), []).append(c)
    return sorted({c for points in seen.values() for c in (points[0], points[len(points) // 2], points[-1])})


@pytest.mark.parametrize("style", ["gpt2", "llama3"])
def test_a_tokenizer_without_added_tokens(tmp_path, sources, style):
    """No added tokens: tiktoken's plain encode (its special-token search would look for an empty pattern)."""
    path = train(tmp_path / "plain.json", style, sources, vocab=1500, added=False)
    assert_same(path, sources[:10] + EDGE)


@pytest.mark.parametrize("style", STYLES)
def test_every_code_point_class_in_context(tokenizers_by_style, style):
    # a few code points of every general category and every 499th code point (the regex engines: all of them)
    points = sorted(set(class_points()) | set(range(0, 0x110000, 499)))
    assert_same(tokenizers_by_style[style], code_point_texts(points))


def code_point_texts(points: list[int] | None = None, block: int = 4096) -> list[str]:
    """Return texts of the code points (all but surrogates by default) in the contexts the regexes tell apart."""
    if points is None:
        points = list(range(0x110000))
    points = [c for c in points if not 0xD800 <= c <= 0xDFFF]
    return ["".join(f" {c}{c}'{c}a{c}1\n{c}  {c}." for c in map(chr, points[a:a + block]))
            for a in range(0, len(points), block)]


def swept_points() -> list[int] | None:
    """Return the code points the engines' sweep compares (None: all of them, with SORTPACK_EXHAUSTIVE_TESTS=1).

    Every code point of planes 0-3 and 14 (all of Unicode's assigned letters, marks, numbers,
    punctuation and the tag characters) and every 499th of the rest: planes 4-13 are unassigned
    and 15-16 private use, each one category that the regexes treat alike, so a sample of them
    says what all of them would at a quarter of the time.
    """
    import os

    if os.environ.get("SORTPACK_EXHAUSTIVE_TESTS") == "1":
        return None
    return sorted(set(range(0x40000)) | set(range(0xE0000, 0xF0000)) | set(range(0, 0x110000, 499)))


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", sorted(VERIFIED_PATTERNS))
def test_both_regex_engines_split_every_code_point_alike(name):
    """The two engines' pieces, seen through an encoding whose only tokens are the pieces tokenizers' regex cut.

    Each piece is a token of its own, so tiktoken gives the expected ids exactly when its regex
    cuts the same pieces (a piece it cuts otherwise is not a token and comes out in smaller ones).
    """
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
        enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        assert enc.encode_ordinary(text) == [ranks[p] for p in pieces]


CHARS = st.one_of(st.characters(blacklist_categories=("Cs",)),
                  st.sampled_from(list(" \t\n\r\u00a0\u3000'sSdlLtvVmMrReE019")))
TEXT = st.lists(st.one_of(st.text(CHARS, max_size=30), st.sampled_from(SPECIALS)), max_size=6).map("".join)


@pytest.mark.parametrize("style", STYLES)
def test_random_text_property(tokenizers_by_style, style):
    from tokenizers import Tokenizer

    path = tokenizers_by_style[style]
    enc, hf = load_tokenizer(path), Tokenizer.from_file(path)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(TEXT, max_size=6), st.booleans())
    def check(texts, special):
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
        assert fast_lists(enc, texts, special) == want

    check()


def test_threads_give_the_same_ids(tokenizers_by_style, sources, monkeypatch):
    path = tokenizers_by_style["qwen2"]
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    assert fast_lists(load_tokenizer(path), sources, True) == hf_reference(path, sources, True)


def test_counts_and_ids_of_a_column_match_the_reference(tokenizers_by_style, sources):
    path = tokenizers_by_style["llama3"]
    col = pa.chunked_array([sources[:7], [], sources[7:20]], pa.large_string())
    spec = parse_spec("tokens", "text", "--size")
    want = hf_reference(path, sources[:20], True)
    sizes = evaluate(spec, pa.table({"text": col}), "x", tokenizer=load_tokenizer(path))
    assert sizes.tolist() == [len(w) for w in want]
    ids, counts = token_ids(load_tokenizer(path), col)
    assert ids.to_pylist() == want and counts.tolist() == [len(w) for w in want]
    from tokenizers import Tokenizer

    bare_ids, _ = token_ids(Tokenizer.from_file(path), col)  # a plain tokenizers.Tokenizer still works
    assert bare_ids.to_pylist() == want


def _column_lists(enc, texts: list[str], special: bool, chunks: int = 3) -> tuple[list[list[int]], list[int]]:
    """Return ``token_ids``' ids (as lists) and its counts-only sizes, the texts in ``chunks`` string chunks."""
    cut = [len(texts) * k // chunks for k in range(chunks + 1)]
    col = pa.chunked_array([texts[a:b] for a, b in zip(cut[:-1], cut[1:])], pa.string())
    ids, counts = token_ids(enc, col, special)
    _, only = token_ids(enc, col, special, keep=False)
    assert only.tolist() == counts.tolist()
    return ids.to_pylist(), counts.tolist()


@pytest.mark.parametrize("style,added", [("gpt2", True), ("gpt2", False), ("llama3", True), ("qwen2", True)])
def test_ascii_texts_take_the_compiled_path_with_the_same_ids(tmp_path, sources, style, added):
    """GPT-2's, Llama 3's and Qwen 2's patterns: ASCII texts through kernels.bpe, the others (non-ASCII, holding
    an added token's text) through tiktoken, spliced back in order: the ids of ``Tokenizer.encode`` either way."""
    path = train(tmp_path / f"{style}.json", style, sources, added=added)
    enc = load_tokenizer(path)
    if backend() == "c":
        assert enc.record()["compiled"] == "utf-8"
    texts = sources[:25] + EDGE + ["plain ascii again", "x<tool>y", "<|im_start|> a", ""]
    for special in (True, False):
        ids, counts = _column_lists(enc, texts, special)
        want = hf_reference(path, texts, special)
        assert ids == want and counts == [len(w) for w in want]


@pytest.mark.parametrize("style", ["gpt2", "llama3", "qwen2"])
def test_random_ascii_columns_property(tokenizers_by_style, style):
    """Hypothesis' ASCII strings (every byte class, contractions, whitespace runs, added tokens) as columns."""
    from tokenizers import Tokenizer

    path = tokenizers_by_style[style]
    enc, hf = load_tokenizer(path), Tokenizer.from_file(path)
    ascii_text = st.lists(st.one_of(st.text(st.characters(max_codepoint=127), max_size=12),
                                    st.text(st.sampled_from(list(" \t\n\r\v\f'sSdlLmtrReEv09x_(.")), max_size=10),
                                    st.sampled_from(SPECIALS)), max_size=6).map("".join)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(ascii_text, min_size=1, max_size=8), st.booleans())
    def check(texts, special):
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
        assert _column_lists(enc, texts, special, chunks=1)[0] == want

    check()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=5), min_size=1,
                max_size=6, unique=True),
       st.lists(st.text(st.sampled_from(list("<|>[]().*+?^$\\{}ab x")), max_size=12), max_size=8))
def test_texts_holding_an_added_tokens_text_are_found_in_one_pass(added, texts):
    from sortpack.inputs.token_columns import holding as _holding

    got = _holding(pa.array(texts, pa.string()), frozenset(added)).tolist()
    assert got == [int(any(a in t for a in added)) for t in texts]


def test_the_compiled_path_in_threads_gives_the_same_ids(tokenizers_by_style, sources, monkeypatch):
    path = tokenizers_by_style["gpt2"]
    texts = sources + EDGE
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")
    one = _column_lists(load_tokenizer(path), texts, True, chunks=2)
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    assert _column_lists(load_tokenizer(path), texts, True, chunks=2) == one
    assert one[0] == hf_reference(path, texts, True)
    monkeypatch.setattr("sortpack.inputs.token_columns.RUN_BYTES", 997)  # many runs per chunk, some of one text
    assert _column_lists(load_tokenizer(path), texts, True, chunks=2) == one


def test_tiktoken_alone_is_a_switch_and_gives_the_same_ids(tokenizers_by_style, sources, monkeypatch):
    path = tokenizers_by_style["gpt2"]
    texts = sources[:10] + EDGE
    default = _column_lists(load_tokenizer(path), texts, True)
    monkeypatch.setenv("SORTPACK_FAST_TOKENIZER", "tiktoken")
    enc = load_tokenizer(path)
    assert enc.engine == "tiktoken" and "compiled" not in enc.record()
    assert _column_lists(enc, texts, True) == default
    monkeypatch.delenv("SORTPACK_FAST_TOKENIZER")
    tekken = load_tokenizer(tokenizers_by_style["tekken"])  # a pattern the kernel does not split by: tiktoken alone
    assert tekken.engine == "tiktoken" and "compiled" not in tekken.record()


# --- when the conversion is refused --------------------------------------------------------------------------
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


def test_the_switch_and_a_missing_tiktoken_fall_back(tokenizers_by_style, monkeypatch):
    path = tokenizers_by_style["gpt2"]
    monkeypatch.setenv("SORTPACK_FAST_TOKENIZER", "0")
    enc = load_tokenizer(path)
    assert enc.engine == "tokenizers" and enc.record()["why"] == "SORTPACK_FAST_TOKENIZER=0"
    monkeypatch.delenv("SORTPACK_FAST_TOKENIZER")
    monkeypatch.setattr("sortpack.inputs.fast_tokens._tiktoken_version", lambda: None)
    enc = load_tokenizer(path)
    assert enc.engine == "tokenizers" and "tiktoken is not installed" in enc.reason


@pytest.mark.slow
@pytest.mark.parametrize("style", ["llama3", "gpt2"])
def test_plans_are_byte_identical_whichever_encoder_ran(tokenizers_by_style, sources, tmp_path, style):
    """Same data files and content_hash with tiktoken (and its compiled ASCII path) and with tokenizers;
    provenance says which ran."""
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
    if backend() == "c":
        assert one["provenance"]["tokenizers"][f"{style}.json"]["compiled"] == "utf-8"


def test_a_loaded_encoder_pickles_for_worker_processes(tokenizers_by_style, sources):
    import pickle

    for path in (tokenizers_by_style["gpt2"], tokenizers_by_style["llama3"]):
        enc = load_tokenizer(path)
        enc.encode_texts(sources[:4])  # its thread pool exists now and is not sent
        back = pickle.loads(pickle.dumps(enc))
        assert back.engine == enc.engine
        assert fast_lists(back, sources[:20], True) == fast_lists(enc, sources[:20], True)
