"""Tokenizers for the tokenizer-path tests: trained here, or converted from the real vocabularies of registry packages.

Byte-level BPEs are trained on the Python standard library's source (nothing is downloaded) with
the pre-tokenizers of GPT-2 (ByteLevel's own regex), Llama 3 (Split regex, ``ignore_merges``, a BOS
template), Qwen 2 and Mistral-Nemo (tekken). The real ones are openai-whisper's ``gpt2.tiktoken`` and
``multilingual.tiktoken`` written as tokenizer.json files (``benchmarks/real_vocab.py``), with
GPT-2's, Llama 3's and Qwen 2's pattern and ``ignore_merges``; the tests that need them skip where
openai-whisper is not installed (``pip install --no-deps openai-whisper``: its dependencies pull torch).
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np

from sortpack.inputs.bpe_conversion import VERIFIED_PATTERNS

SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<tool>"]
STYLES = ["gpt2", "llama3", "qwen2", "tekken"]
EDGE = ["", " ", "\n", "  \n\n\t  x", "x" * 5000, " " * 3000, "\r\n" * 500, "9" * 1000, "é" * 700,
        "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|im_start|>user\nhi<tool> x",
        "<|begin_of_text|>", "<|endoftext", "endoftext|>", "'s 'S 'll 'LL 'ſ", "don't WE'RE", "\u3000\u00a0\u2028x",
        "😀👍🏽 emoji", "日本語のテキスト", "ﷺ ﷽", "x\u0301\u0308", "\U0010fffd\U000e0001", "tab\tsep\vend\f"]


def stdlib_sources(files: int) -> list[str]:
    """Return the first standard-library modules' sources (real code: identifiers, strings, comments, whitespace)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in lib.glob("*.py"))[:files]
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]


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


def hf_reference(path: str, texts: list[str], special: bool) -> list[list[int]]:
    """Return Hugging Face ``tokenizers``' ids of ``texts`` with the file at ``path`` (the reference)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=special)]


def fast_lists(enc, texts: list[str], special: bool) -> list[list[int]]:
    """Return a ``TokenEncoder``'s ``encode_texts`` ids of ``texts``, one list per text."""
    ids, counts = enc.encode_texts(texts, special)
    assert ids.dtype == np.int32 and counts.dtype == np.int64
    return [a.tolist() for a in np.split(ids, np.cumsum(counts)[:-1])] if len(texts) else []


def column_lists(enc, texts: list[str], special: bool, chunks: int = 3) -> tuple[list[list[int]], list[int]]:
    """Return ``token_ids``' ids (as lists) and its counts-only sizes, the texts in ``chunks`` string chunks."""
    import pyarrow as pa

    from sortpack.inputs.token_columns import token_ids

    cut = [len(texts) * k // chunks for k in range(chunks + 1)]
    col = pa.chunked_array([texts[a:b] for a, b in zip(cut[:-1], cut[1:])], pa.string())
    ids, counts = token_ids(enc, col, special)
    _, only = token_ids(enc, col, special, keep=False)
    assert only.tolist() == counts.tolist()
    return ids.to_pylist(), counts.tolist()


def class_points() -> list[int]:
    """Return the first, middle and last code point of every Unicode general category (this Python's tables)."""
    import unicodedata

    seen: dict[str, list[int]] = {}
    for c in range(0x110000):
        if not 0xD800 <= c <= 0xDFFF:
            seen.setdefault(unicodedata.category(chr(c)), []).append(c)
    return sorted({c for points in seen.values() for c in (points[0], points[len(points) // 2], points[-1])})


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


def real_vocabulary(name: str, folder: Path) -> str | None:
    """Return the tokenizer.json of ``benchmarks.real_vocab.VARIANTS[name]`` in ``folder`` (None: no openai-whisper)."""
    from benchmarks.real_vocab import write_variant

    path = write_variant(name, folder)
    return None if path is None else str(path)
