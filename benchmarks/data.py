"""Synthetic inputs, generated deterministically and cached under ``benchmarks/_work``."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

WORK = Path(__file__).resolve().parent / "_work"
SIZE_LO, SIZE_HI = 128, 4096  # sample sizes are uniform on [SIZE_LO, SIZE_HI]
BLOCK = 1 << 20  # rows generated per RNG stream: any slice regenerates identically
SEED = 20240601


def work_dir(*parts: str) -> Path:
    """Return (creating it) a directory under ``benchmarks/_work``."""
    path = WORK.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sizes_range(start: int, stop: int, seed: int = SEED) -> np.ndarray:
    """Return the sizes of global rows ``[start, stop)`` (int64, uniform SIZE_LO..SIZE_HI)."""
    out = np.empty(max(stop - start, 0), np.int64)
    pos = start
    while pos < stop:
        block = pos // BLOCK
        # one stream per block lets every rank build its own slice without the others
        vals = np.random.default_rng([seed, block]).integers(SIZE_LO, SIZE_HI + 1, size=BLOCK)
        a, b = pos - block * BLOCK, min(stop - block * BLOCK, BLOCK)
        out[pos - start:pos - start + b - a] = vals[a:b]
        pos += b - a
    return out


def id_bits(total: int) -> int:
    """Return the bits needed for sample ids ``0..total-1`` (as sortpack packs them)."""
    return max(1, int(total - 1).bit_length())


def packed_keys(start: int, stop: int, total: int) -> np.ndarray:
    """Return uint64 records ``size << id_bits | id`` for global rows ``[start, stop)``."""
    ids = np.arange(start, stop, dtype=np.uint64)
    return (sizes_range(start, stop).astype(np.uint64) << np.uint64(id_bits(total))) | ids


def size_parquet(n: int, files: int = 4, row_group: int = 1 << 18) -> Path:
    """Return a directory of Parquet files with ``n`` rows of an int32 ``ntokens`` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = WORK / f"sizes-{n}"
    if (out / "_done.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, n, files + 1).astype(np.int64)
    for i in range(files):
        a, b = int(bounds[i]), int(bounds[i + 1])
        table = pa.table({"ntokens": pa.array(sizes_range(a, b).astype(np.int32))})
        pq.write_table(table, out / f"part-{i:03d}.parquet", row_group_size=row_group)
    (out / "_done.json").write_text(json.dumps({"rows": n, "files": files}))
    return out


def _vocabulary(words: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Return (bytes, offsets) of ``words`` pseudo-words, Zipf-ish lengths 2..12."""
    lengths = np.clip(rng.geometric(0.2, size=words) + 1, 2, 12)
    letters = rng.integers(ord("a"), ord("z") + 1, size=int(lengths.sum()), dtype=np.uint8)
    return letters, np.concatenate(([0], np.cumsum(lengths)))


def _texts(n: int, rng: np.random.Generator, vocab: tuple[np.ndarray, np.ndarray], mean_words: int):
    """Return a pyarrow StringArray of ``n`` texts made of vocabulary words and spaces."""
    import pyarrow as pa

    letters, voff = vocab
    nvocab = len(voff) - 1
    counts = rng.integers(1, 2 * mean_words, size=n)
    # log-uniform word ranks (Zipf with exponent 1) make BPE merges meaningful
    words = np.exp(rng.random(int(counts.sum())) * np.log(nvocab)).astype(np.int64) - 1
    wlen = voff[words + 1] - voff[words] + 1  # +1: the space after each word
    total = int(wlen.sum())
    starts = np.repeat(voff[words], wlen)
    within = np.arange(total) - np.repeat(np.cumsum(wlen) - wlen, wlen)
    is_space = within == np.repeat(wlen - 1, wlen)
    buf = np.where(is_space, np.uint8(ord(" ")), letters[np.minimum(starts + within, len(letters) - 1)])
    word_end = np.cumsum(wlen)
    text_end = word_end[np.cumsum(counts) - 1] - 1  # drop each text's trailing space
    text_start = np.concatenate(([0], word_end[np.cumsum(counts)[:-1] - 1]))
    # texts are separated by one dropped space: keep offsets contiguous by rebuilding
    keep = np.ones(total, bool)
    keep[text_end] = False
    buf = buf[keep]
    lens = text_end - text_start
    offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(buf.tobytes()))


def text_parquet(n: int, mean_words: int = 40, chunk: int = 50_000, name: str = "texts") -> Path:
    """Return a Parquet file of ``n`` word-like texts in a ``text`` column.

    Row groups hold about n/16 rows: sortpack's analyze hands out whole row groups, so
    a file of one row group could only ever be read by one rank.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = WORK / f"{name}-{n}.parquet"
    if path.is_file():
        return path
    WORK.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([SEED, n])
    group = max(1000, min(chunk, n // 16))
    vocab = _vocabulary(20_000, rng)
    schema = pa.schema([("text", pa.string())])
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, schema) as writer:
        for a in range(0, n, chunk):
            arr = _texts(min(chunk, n - a), rng, vocab, mean_words)
            writer.write_table(pa.table({"text": arr}, schema=schema), row_group_size=group)
    os.replace(tmp, path)
    return path


def tokenizer_file(texts_path: Path, vocab_size: int = 8000, train_rows: int = 20_000) -> Path | None:
    """Return a BPE ``tokenizer.json`` trained locally on generated texts (None without tokenizers)."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        return None
    import pyarrow.parquet as pq

    path = WORK / f"tokenizer-{vocab_size}.json"
    if path.is_file():
        return path
    texts = pq.read_table(texts_path, columns=["text"]).column("text").slice(0, train_rows).to_pylist()
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]"], show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return path
