"""Chats of a known family encoded without Jinja or per-conversation Python: ``fast_render``'s slots tokenized in one
call, the targets from byte offsets.

A chat's text is its slots one after another; every special token of the pattern is an added token
of the tokenizer, which splits them out before its pre-tokenizer, so the ids of a conversation are
its slots' ids one after another: the text slots of every conversation go through the encoder's
compiled path at once (``TokenEncoder.encode_column``; a text holding an added token's text
through tiktoken, which splits it), a special slot is its token's id. Only where tiktoken gives the
tokenizer.json's ids exactly (a byte-level BPE: the ids spell the text's bytes) so a token's byte
offsets are the running sum of its tokens' lengths (``TokenEncoder.token_lengths``); a token is a
target where one of its bytes lies in a target span, as ``chats._target_flags`` decides from
character offsets (a span starts and ends on a character, so the two agree). Conversations the
pattern does not cover are encoded by ``chats.encode_chats`` and put back in their places.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ... import arrow_compute as ac
from ..fast_tokens import RENDERED
from .encoded import Encoded, Rows, encoded, overlapping, positions
from .fast_render import Layout, fast_family, render_layout


def _special_ids(encoder, layout: Layout) -> list[int | None] | None:
    """Return each slot's token id (None for a text slot); None when a special text is no added token."""
    out: list[int | None] = []
    for special in layout.specials:
        if special is None:
            out.append(None)
            continue
        tid = encoder.token_to_id(special)
        if tid is None or special not in encoder.allowed:
            return None
        out.append(int(tid))
    return out


def _slot_tokens(encoder, layout: Layout, ids_of: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """Return (every message's tokens slot after slot, message after message; each message's token count)."""
    m, width = len(layout.messages.roles), len(layout.specials)
    text_slots = [w for w in range(width) if ids_of[w] is None]
    # the text slots in order (message-major): one column, one call to the compiled path
    column = pa.concat_arrays([layout.slot_text(w) for w in text_slots]) if text_slots else pa.array([], pa.string())
    order = (np.arange(len(text_slots))[None, :] * m + np.arange(m)[:, None]).ravel()
    column = ac.take(column, pa.array(order, pa.int64()))
    got = encoder.encode_column(column, special_tokens=False)
    ids, text_counts = got if got is not None else encoder.encode_texts(column.to_pylist(), special_tokens=False)
    counts = np.zeros((m, width), np.int64)
    counts[:, text_slots] = text_counts.reshape(m, len(text_slots))
    special_id = np.zeros((m, width), np.int64)
    for w, tid in enumerate(ids_of):
        if tid is not None:
            present = layout.present[w]
            counts[:, w] = 1 if present is None else present.astype(np.int64)
            special_id[:, w] = tid
    is_text = np.zeros((m, width), bool)
    is_text[:, text_slots] = True
    from_text = np.repeat(is_text.ravel(), counts.ravel())
    out = np.empty(len(from_text), np.int64)
    out[from_text] = ids
    out[~from_text] = np.repeat(special_id.ravel()[~is_text.ravel()], counts.ravel()[~is_text.ravel()])
    return out, counts.sum(axis=1)


def _spans(layout: Layout, roles: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
    """Return the target spans' (starts, ends) in bytes on one axis of every message's text in order."""
    lengths = layout.byte_lengths()
    unit_end = np.cumsum(lengths.sum(axis=1))
    unit_start = unit_end - lengths.sum(axis=1)
    content = unit_start + lengths[:, :layout.content_slot].sum(axis=1) + layout.content_offset
    rule = layout.rule
    start = content - layout.lead if rule.before else content
    if rule.header:
        start = unit_start
    end = unit_end if rule.after else unit_end - layout.tail
    chosen = np.asarray(ac.is_in(layout.messages.roles, pa.array(sorted(roles), pa.string())))
    chosen &= end > start
    return start[chosen], end[chosen]


def _target_flags(ids: np.ndarray, lengths: np.ndarray, spans: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Return, per token, whether one of its bytes lies in a span (sorted, disjoint) of the same axis."""
    size = lengths[ids]
    end = np.cumsum(size)
    return overlapping(end - size, end, spans)


def encode_layout(encoder, layout: Layout, roles: frozenset[str]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | np.ndarray | None:
    """Return (flat ids, target flags, per-conversation counts) of the laid out conversations; a bool per rendered
    conversation where a SentencePiece-style encoder leaves some to Jinja (``sp_chats``: lay out the others again);
    None where this encoder cannot (neither tiktoken-exact nor SentencePiece-style compiled, or a special text of the
    pattern is no added token)."""
    lengths = encoder.token_lengths() if hasattr(encoder, "token_lengths") else None
    if lengths is None:
        from .sp_chats import encode_sp

        return encode_sp(encoder, layout, _spans(layout, roles))
    ids_of = _special_ids(encoder, layout)
    if ids_of is None:
        return None
    ids, per_message = _slot_tokens(encoder, layout, ids_of)
    flags = _target_flags(ids, lengths, _spans(layout, roles))
    bounds = np.concatenate(([0], np.cumsum(layout.messages.counts)))
    per_message_sum = np.concatenate(([0], np.cumsum(per_message)))
    return ids, flags, per_message_sum[bounds[1:]] - per_message_sum[bounds[:-1]]


def _put_back(ok: np.ndarray, fast: tuple, slow: Encoded | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (flat ids, flags, counts) of every conversation in order: ``fast``'s where ``ok``, ``slow``'s else."""
    ids, flags, counts = fast
    if slow is None:
        return ids, flags, counts
    slow_ids = slow.ids.values.to_numpy(zero_copy_only=False).astype(np.int64)
    slow_flags = slow.labels.values.to_numpy(zero_copy_only=False) != -100
    all_counts = np.zeros(len(ok), np.int64)
    all_counts[ok], all_counts[~ok] = counts, slow.sizes
    source = np.zeros(len(ok), np.int64)  # each conversation's first id in fast's ids then slow's
    source[ok] = np.cumsum(counts) - counts
    source[~ok] = len(ids) + np.cumsum(slow.sizes) - slow.sizes
    take = np.repeat(source, all_counts) + positions(all_counts)
    return np.concatenate((ids, slow_ids))[take], np.concatenate((flags, slow_flags))[take], all_counts


BATCH = 1 << 16  # conversations laid out at once: bounded memory, a batch's texts within 32-bit offsets


def _batch(shape, col, first: int, rows: Rows, slow) -> tuple | None:
    """Return (ids, flags, counts, roles, family) of the conversations ``col`` (the column's from ``first`` on);
    None where no family pattern applies."""
    got = render_layout(shape.template, col)
    if got is None:
        return None
    layout, roles_on = got[1], frozenset(shape.train_on)
    fast = encode_layout(shape.encoder, layout, roles_on)
    if isinstance(fast, np.ndarray):  # some conversations are Jinja's after all: the others laid out again
        again = fast_family(shape.template)
        assert again is not None
        kept = again.lay_out(layout.messages.keep(~fast), shape.template.special_tokens)
        if kept is None:
            return None
        layout, fast = kept, encode_layout(shape.encoder, kept, roles_on)
    if fast is None or isinstance(fast, np.ndarray):
        return None
    ok = layout.messages.ok
    others = np.flatnonzero(~ok)
    slow_part = None
    if len(others):
        subset = ac.take(col, pa.array(others)).to_pylist()
        slow_part = slow(subset, Rows(rows.path, 0, lambda j: rows.row(first + int(others[j]))))
    roles = frozenset(ac.unique(layout.messages.roles).to_pylist())
    if slow_part is not None and slow_part.roles:
        roles |= slow_part.roles
    return (*_put_back(ok, fast, slow_part), roles, got[0])


def encode_fast(shape, col, rows: Rows, slow) -> Encoded | None:
    """Return the ``Encoded`` of a messages column of a loaded ``chats.ChatShape`` (its encoder, template and
    ``train_on``), a known family's conversations without Jinja (``slow(chats, rows)`` encodes the others, named
    by their rows); None where no family pattern applies (the caller's path)."""
    parts: tuple[list, list, list] = ([], [], [])
    roles: frozenset[str] = frozenset()
    family = None
    for a in range(0, max(len(col), 1), BATCH):
        got = _batch(shape, col.slice(a, BATCH), a, rows, slow)
        if got is None:
            return None  # the same template and column type in every batch: none applies
        for part, value in zip(parts, got[:3]):
            part.append(value)
        roles |= got[3]
        family = got[4]
    # the same ids either way: which path ran is provenance (conversations the pattern does not cover: Jinja)
    RENDERED[shape.template.name] = {"render": "pattern", "family": family}
    return encoded(*parts, roles=roles)
