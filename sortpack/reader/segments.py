"""How ``varlen_collate`` lays a micro-batch out: its segments (documents, and each packed row's padding)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .microbatch import MicroBatch


class Segments(NamedTuple):
    """How ``varlen_collate`` lays a micro-batch out: one entry per segment (a document or a row's padding)."""

    length: np.ndarray  # tokens of each segment, padding included
    real: np.ndarray  # real tokens of each segment
    sample: np.ndarray  # the sample of each segment (its place in the micro-batch), -1 for a row's padding
    width: int | None  # rows mode: the padded row length; None otherwise


def segments(lengths: np.ndarray, mb: MicroBatch | None, pad_to_multiple: int | None) -> Segments:
    """Return the ``Segments`` of a micro-batch whose samples have ``lengths`` tokens.

    Rows mode (the micro-batch's ``row_splits`` and ``padded_size``): each row's samples (each
    padded to a multiple of ``pad_to_multiple`` when given), cut to the row's room, then the
    row's padding tail as its own segment. Otherwise one segment per sample, padded to a
    multiple of ``pad_to_multiple`` when given.
    """
    if mb is not None and mb.row_splits is not None and mb.padded_size is not None:
        return _rows(lengths, np.asarray(mb.row_splits, dtype=np.int64), int(mb.padded_size), pad_to_multiple)
    if mb is not None and mb.padded_size is not None:
        lengths = np.minimum(lengths, int(mb.padded_size))  # as pad_collate: never longer than the plan's shape
    seg_len = -(-lengths // pad_to_multiple) * pad_to_multiple if pad_to_multiple and pad_to_multiple > 1 else lengths
    return Segments(seg_len, lengths, np.arange(len(lengths), dtype=np.int64), None)


def _rows(lengths: np.ndarray, splits: np.ndarray, width: int, pad_to_multiple: int | None) -> Segments:
    """Return the ``Segments`` of packed rows of ``width`` tokens whose samples ``splits`` bounds (see ``segments``)."""
    n = len(lengths)
    k = pad_to_multiple if pad_to_multiple and pad_to_multiple > 1 else 1
    rows = len(splits) - 1
    row_of = np.repeat(np.arange(rows), np.diff(splits))
    padded = -(-lengths // k) * k  # a plan packed with --pad-to-multiple K counted them so: they fit
    cum = np.concatenate(([0], np.cumsum(padded)))
    before = cum[:-1] - cum[splits[:-1]][row_of]  # tokens before each sample in its row
    kept = np.clip(width - before, 0, padded)  # a row longer than its packed length is cut
    room = width - np.bincount(row_of, weights=kept, minlength=rows).astype(np.int64)
    pads = room > 0
    pads_before: np.ndarray = np.cumsum(pads) - pads
    seg_len = np.zeros(n + int(pads.sum()), dtype=np.int64)
    seg_sample = np.full(len(seg_len), -1, dtype=np.int64)
    at = np.arange(n) + pads_before[row_of]
    seg_len[at], seg_sample[at] = kept, np.arange(n)
    seg_len[(splits[1:] + pads_before)[pads]] = room[pads]
    seg_real = np.zeros(len(seg_len), dtype=np.int64)
    seg_real[at] = np.minimum(kept, lengths)  # a document's own tokens, without its padding to K
    return Segments(seg_len, seg_real, seg_sample, width)
