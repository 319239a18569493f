"""A known family's laid out chats through a SentencePiece-style file's compiled BPE (Mistral's): ids and targets
without Jinja, from byte offsets.

Such a file splits its added tokens out of the rendered text first and merges each text between
them as one word, so the slots between two special slots are one text (a segment) and their
ids are the segment's: the segments of every conversation go through ``kernels.sp_bpe`` at once,
with the replacement in front as the file puts it on a text after an added token
(``SpConversion.after_added``: a Prepend normalizer on every one, Metaspace "first" on none).
A token stands for its text's bytes with the replacement one byte (a space); the one put in
front stands for none, and a token that is that replacement alone stands, as ``tokenizers``'
offsets say, for the segment's first character. A token is a target where one of those bytes
lies in a target span (``fast_chats._spans``), as ``chats._target_flags`` decides from
``tokenizers``' character offsets (``encoded.overlapping``).

A conversation whose segments hold an added token's text or the replacement character (which
the byte count cannot tell from a space), or that the kernel leaves out, is left to Jinja.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ... import arrow_compute as ac
from .encoded import overlapping
from .fast_render import Layout, _constant


def _entries(conv, layout: Layout) -> tuple[np.ndarray, np.ndarray, pa.Array, np.ndarray] | None:
    """Return every present slot message after message as (its special id, -1 for a text; its bytes; the texts of
    the text slots in that order; each slot's message), empty texts left out; None where a special slot is an added
    token that takes whitespace beside it."""
    m, width = len(layout.messages.roles), len(layout.specials)
    ids = np.full((m, width), -1, np.int64)
    texts: list[pa.Array] = []
    for w, special in enumerate(layout.specials):
        if special is not None and special in conv.special:
            if special not in conv.plain:
                return None
            ids[:, w] = conv.special[special]
            texts.append(pa.nulls(m, pa.string()))
        else:
            texts.append(layout.slot_text(w) if special is None else _constant(special, m))
    lengths = layout.byte_lengths()
    present = np.ones((m, width), bool)
    for w, where in enumerate(layout.present):
        if where is not None:
            present[:, w] = where
    keep = (present & ((ids >= 0) | (lengths > 0))).ravel()
    flat_ids = ids.ravel()[keep]
    column = pa.concat_arrays(texts) if texts else pa.array([], pa.string())
    order = (np.arange(width)[None, :] * m + np.arange(m)[:, None]).ravel()[keep]
    column = ac.take(column, pa.array(order[flat_ids < 0], pa.int64()))
    message = np.repeat(np.arange(m), width)[keep]
    return flat_ids, lengths.ravel()[keep], column, message


def _segments(encoder, conv, tab, column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Return (the ids of every segment in order, each segment's count, -1 where left to Jinja; each segment's first
    byte) through the kernel in the encoder's threads."""
    from ...kernels.sp_bpe import STYLE
    from ..token_columns import compiled_runs, holding, string_buffers

    got = string_buffers(column)
    if got is None:
        return None
    skip = holding(column, frozenset(conv.special) | {conv.vocab.replacement})
    ids, counts = compiled_runs(encoder, (tab, STYLE), got, skip)
    assert ids is not None
    data, offsets = got
    first = data[np.minimum(offsets[:-1], max(len(data) - 1, 0))] if len(offsets) > 1 else np.zeros(0, np.uint8)
    return ids, counts, first


def _phantoms(conv, size: np.ndarray, first: np.ndarray, counts: np.ndarray, lead: np.ndarray) -> np.ndarray:
    """Take the replacement the file puts in front of a segment out of the bytes of the segment's first token
    (``size``, in place: it is no byte of the text); return the tokens that are that replacement alone.
    ``first``, ``counts`` and ``lead``: each segment's first token, tokens and first byte."""
    from ...kernels.sp_bpe import ALWAYS, UNLESS_THERE

    if conv.after_added == ALWAYS:
        phantom = counts > 0
    elif conv.after_added == UNLESS_THERE:
        phantom = (lead != ord(" ")) & (counts > 0)
    else:
        return np.zeros(0, np.int64)
    holder = first[phantom]
    size[holder] -= 1
    return holder[size[holder] == 0]


def encode_sp(encoder, layout: Layout, spans: tuple[np.ndarray, np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | np.ndarray | None:
    """Return (flat ids, target flags, per-conversation counts) of the laid out conversations (``spans``: their target
    spans in bytes, ``fast_chats._spans``); a bool per rendered conversation where some must be left to Jinja (lay
    out the others again); None where this encoder is no SentencePiece-style one the kernel runs."""
    conv = getattr(encoder, "sentencepiece", None)
    if conv is None:
        return None
    tab, sizes_of = conv.segment_table(), conv.text_bytes()
    got = _entries(conv, layout) if tab is not None and sizes_of is not None else None
    if got is None:
        return None
    special, nbytes, column, message = got
    n = len(layout.messages.counts)
    if not len(special):
        return np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(n, np.int64)
    conv_of = np.repeat(np.arange(n), layout.messages.counts)[message]
    is_text = special < 0
    # a segment starts at a text slot after a special one or another conversation's
    starts = is_text.copy()
    starts[1:] &= ~is_text[:-1] | (conv_of[1:] != conv_of[:-1])
    if conv.after_added != conv.vocab.prepend and is_text[np.r_[True, conv_of[1:] != conv_of[:-1]]].any():
        return None  # a conversation that starts with text would take the file's first-text rule there
    bounds = np.flatnonzero(starts[is_text])
    joined = ac.binary_join(pa.ListArray.from_arrays(pa.array(np.r_[bounds, is_text.sum()].astype(np.int32)),
                                                     column), "")
    encoded = _segments(encoder, conv, tab, joined)
    if encoded is None:
        return None
    ids, seg_counts, lead = encoded
    unit = ~is_text | starts  # the slots that are tokens' sources: specials and each segment's first slot
    unit_conv = conv_of[unit]
    if (seg_counts < 0).any():
        drop = np.zeros(n, bool)
        drop[unit_conv[is_text[unit]][seg_counts < 0]] = True
        return drop
    unit_special = special[unit] >= 0
    unit_counts = np.ones(int(unit.sum()), np.int64)
    unit_counts[~unit_special] = seg_counts
    from_text = np.repeat(~unit_special, unit_counts)
    flat = np.empty(len(from_text), np.int32)
    flat[from_text] = ids
    flat[~from_text] = special[unit][unit_special]
    size = sizes_of[flat]
    alone = _phantoms(conv, size, np.cumsum(unit_counts)[~unit_special] - seg_counts, seg_counts, lead)
    end = np.cumsum(size)
    counts = np.bincount(unit_conv, weights=unit_counts, minlength=n).astype(np.int64)
    # every conversation's tokens must stand for its bytes, no more, no less: else Jinja renders it
    per_conv = np.diff(end[np.cumsum(counts)[counts > 0] - 1], prepend=0)
    want = np.bincount(conv_of, weights=nbytes, minlength=n).astype(np.int64)[counts > 0]
    if not np.array_equal(per_conv, want):
        drop = np.zeros(n, bool)
        drop[np.flatnonzero(counts > 0)[per_conv != want]] = True
        return drop
    start = np.subtract(end, size, out=size)
    # the replacement alone stands, as tokenizers' offsets say, for the segment's first character: a span (from one
    # character to another) holds that character exactly when it holds its first byte
    end[alone] += 1
    return flat, overlapping(start, end, spans), counts
