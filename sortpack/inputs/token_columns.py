"""Token ids of a whole text column: the compiled path over the Arrow buffers, the other texts spliced back in order.

``plan_runs`` (pure) cuts a column's texts into contiguous runs of about equal bytes, one per
thread at least; ``encode_column`` runs ``kernels.bpe`` over them in the encoder's threads (the
kernel lets go of the GIL), sends the texts it leaves out (holding an added token's text, or not
split by it) to the encoder's own ``encode_others``, and splices their ids back in place.
``token_ids`` is the entry every caller uses: a column's ids and counts, through an encoder's
compiled path where it has one, else 4096 texts at a time as Python strings.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

RUN_BYTES = 1 << 24  # text bytes the compiled path encodes per call (its id buffer is 4 bytes per byte)
_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def plan_runs(offsets: np.ndarray, threads: int, run_bytes: int = RUN_BYTES) -> list[tuple[int, int]]:
    """Return the runs ``[a, b)`` of texts (``offsets``: n + 1 byte offsets) that the compiled path encodes per call.

    Contiguous, of about equal bytes: as many as ``run_bytes`` needs (a run passes it by its last text at most),
    and one per thread at least where there are two texts per thread.

    Examples
    --------
    >>> plan_runs(np.array([0, 10, 20, 30, 40]), threads=2)
    [(0, 2), (2, 4)]
    >>> plan_runs(np.array([0, 10, 20, 30, 40]), threads=1, run_bytes=15)
    [(0, 2), (2, 3), (3, 4)]
    """
    n = len(offsets) - 1
    size = int(offsets[-1] - offsets[0])
    count = max(threads if threads > 1 and n >= 2 * threads else 1, -(-size // max(run_bytes, 1)))
    inner = np.searchsorted(offsets, np.linspace(offsets[0], offsets[-1], count + 1)[1:-1])
    cuts = np.unique(np.concatenate(([0], inner, [n])))
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))


def string_buffers(col: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Return (the UTF-8 bytes, the n + 1 int64 offsets) of a string array without nulls (None: not one)."""
    import pyarrow as pa

    if col.null_count or not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None
    wide = pa.types.is_large_string(col.type)
    bufs = col.buffers()
    offsets = np.frombuffer(bufs[1], np.int64 if wide else np.int32, len(col) + 1, col.offset * (8 if wide else 4))
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and bufs[2].size else np.zeros(1, np.uint8)
    return data, offsets.astype(np.int64)


def holding(col: Any, texts: frozenset[str]) -> np.ndarray:
    """Return, per string of ``col``, whether it holds any of ``texts`` (uint8): one pass of an alternation of
    them (a tokenizer may have hundreds of added tokens)."""
    from .. import arrow_compute as ac

    pattern = "|".join("".join("\\" + c if c in _RE2_SPECIAL else c for c in t) for t in sorted(texts))
    return ac.match_substring_regex(col, pattern).to_numpy(zero_copy_only=False).astype(np.uint8)


def surround(ids: np.ndarray, counts: np.ndarray, prefix: tuple[int, ...], suffix: tuple[int, ...]
             ) -> tuple[np.ndarray, np.ndarray]:
    """Return the ids with ``prefix`` before and ``suffix`` after every text's, and the new counts."""
    a, b = len(prefix), len(suffix)
    new = counts + a + b
    out = np.empty(int(new.sum()), np.int32)
    starts = np.cumsum(new) - new
    # each text's ids land after its prefix: shift every id by the added tokens before its text
    text_of = np.repeat(np.arange(len(counts)), counts)
    out[np.arange(len(ids)) + (a + (a + b) * text_of)] = ids
    for k, t in enumerate(prefix):
        out[starts + k] = t
    for k, t in enumerate(suffix):
        out[starts + new - b + k] = t
    return out, new


def splice(ids: np.ndarray, counts: np.ndarray, left: np.ndarray, theirs: tuple[np.ndarray, np.ndarray]
           ) -> np.ndarray:
    """Return the ids of every text in order: ``ids`` of the texts not in ``left`` (indices), ``theirs`` of those in
    it; ``counts`` (updated in place) holds the left texts' counts afterwards."""
    more, counts[left] = theirs
    mine = np.ones(len(counts), bool)
    mine[left] = False
    from_mine = np.repeat(mine, counts)
    out = np.empty(len(from_mine), np.int32)
    out[from_mine], out[~from_mine] = ids, more
    return out


def compiled_runs(encoder: Any, compiled: tuple[Any, str], texts: tuple[np.ndarray, np.ndarray],
                  skip: np.ndarray | None, keep: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """Return (the ids as one int32 array, None when not ``keep``; each text's count, -1 where the kernel left it)
    of ``texts`` (``string_buffers``) through ``compiled`` (a ``kernels.bpe`` table and its style, or a
    ``kernels.sp_bpe`` table and its ``STYLE``), contiguous runs in the encoder's threads; ``skip`` marks texts to
    leave."""
    from ..kernels import bpe, sp_bpe

    data, offsets = texts
    tab, style = compiled

    def run(ab: tuple[int, int]) -> Any:
        a, b = ab
        part = (data, offsets[a:b + 1]), None if skip is None else skip[a:b]
        if style == sp_bpe.STYLE:
            return sp_bpe.encode(tab, *part, keep)
        return bpe.encode(tab, style, *part, keep)

    done = encoder.map_threads(run, plan_runs(offsets, encoder.threads(), RUN_BYTES))
    counts = np.concatenate([d[1] for d in done]) if done else np.zeros(0, np.int64)
    ids = (np.concatenate([d[0] for d in done]) if done else np.zeros(0, np.int32)) if keep else None
    return ids, counts


def encode_column(encoder: Any, col: Any, special_tokens: bool = True, keep: bool = True
                  ) -> tuple[np.ndarray | None, np.ndarray] | None:
    """Return (a string array's ids as one int32 array, None when not ``keep``; their counts) through the encoder's
    compiled path (``encoder.compiled``: a ``kernels.bpe`` table and its style, or a ``kernels.sp_bpe`` table),
    its other texts through ``encoder.encode_others``; None where that path does not apply (no compiled table,
    nulls, not a string array)."""
    got = string_buffers(col) if encoder.compiled is not None else None
    if got is None:
        return None
    if not len(col):
        return (np.zeros(0, np.int32) if keep else None), np.zeros(0, np.int64)
    import pyarrow as pa

    from .. import arrow_compute as ac

    # a text holding an added token's text goes to the encoder, which finds it; any other is plain text
    ids, counts = compiled_runs(encoder, encoder.compiled, got, holding(col, encoder.allowed) if encoder.allowed
                                else None, keep)
    left = np.flatnonzero(counts < 0)
    if len(left):
        got_left = [encoder.encode_others(ac.take(col, pa.array(left[a:a + 4096])).to_pylist())
                    for a in range(0, len(left), 4096)]
        theirs = np.concatenate([g[0] for g in got_left]), np.concatenate([g[1] for g in got_left])
        if ids is None:
            counts[left] = theirs[1]
        else:
            ids = splice(ids, counts, left, theirs)
    if special_tokens and (encoder.prefix or encoder.suffix):
        if ids is None:
            return None, counts + len(encoder.prefix) + len(encoder.suffix)
        return surround(ids, counts, encoder.prefix, encoder.suffix)
    return ids, counts


def hf_ids(hf, texts: list[str], special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
    """Return (ids as one int32 array, counts) of ``texts`` from Hugging Face ``tokenizers``' batch encode."""
    encode = getattr(hf, "encode_batch_fast", hf.encode_batch)
    ids = [e.ids for e in encode(texts, add_special_tokens=special_tokens)]
    counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(counts.sum()))
    return flat, counts


def token_ids(tokenizer, col: Any, special_tokens: bool = True, keep: bool = True
              ) -> tuple[Any, np.ndarray]:
    """Return the token ids (list<int32>) of a text column and their counts, from one encode per text.

    The ids are exactly what ``tokens`` counts (the same encode, with or without the special
    tokens as ``--special-tokens`` says), so ``len(ids) == size``. ``keep=False``: the counts
    only (the list is empty). An encoder with a compiled path (``TokenEncoder.encode_column``) reads
    each chunk's texts from its Arrow buffers; otherwise texts go to the encoder as Python strings
    4096 at a time. Ids stay in numpy arrays.
    """
    import pyarrow as pa

    from ..arrow_types import plain_column

    encode = getattr(tokenizer, "encode_texts", None)
    if encode is None:  # a bare tokenizers.Tokenizer
        def encode(texts, special):
            return hf_ids(tokenizer, texts, special)
    whole = getattr(tokenizer, "encode_column", None)
    counts, values = [np.zeros(0, np.int64)], [np.zeros(0, np.int32)]
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    for chunk in chunks:
        chunk = plain_column(chunk)
        got = whole(chunk, special_tokens, keep) if whole is not None else None
        if got is not None:  # encoded from its Arrow buffers (the compiled path)
            counts.append(got[1])
            if keep:
                values.append(got[0])
            continue
        for a in range(0, len(chunk), 4096):
            ids, n = encode(chunk.slice(a, 4096).to_pylist(), special_tokens)
            counts.append(n)
            if keep:
                values.append(ids)
    sizes = np.concatenate(counts)
    if not keep:
        return pa.array([], pa.list_(pa.int32())), sizes
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(values), pa.int32())), sizes
