"""``--oversize split``: a sample over the budget becomes consecutive pieces that each fit.

A piece is a plan sample: the source sample id plus its range ``[begin, begin + size)`` in the
unit the size counts (token ids as the tokenizer returns them, special tokens included, under
``--size tokens``; characters of a text or elements of a list under ``length``). Every piece
but the last holds ``cap`` units, the largest length that fits a micro-batch alone
(``truncate_length``); the last holds the rest. So a document's pieces cover its units exactly
once, in order, and the special tokens stay once where the tokenizer put them (the first
piece starts with ``[CLS]``, the last ends with ``[SEP]``).

The planning half (``piece_table``) takes arrays and no communicator; ``split_samples`` numbers
the pieces globally. ``run`` splits right after analyze, before the sort, so pieces are sorted
by their own sizes; ``pack`` of a sorted directory splits and sorts again (``sort.sort_pieces``).
"""
from __future__ import annotations

import numpy as np

from ..distribute import global_start
from ..errors import SortpackError
from ..parallel import Comm
from .samples import SampleColumns, exact_sum

# size kinds whose units a reader can cut: token ids, characters of a text, elements of a list
SPLIT_KINDS = ("tokens", "length")


def check_split(options: dict, mixture: bool = False) -> None:
    """Raise SortpackError when ``--oversize split`` cannot cut this plan's samples (one line, before any work)."""
    size = str(options.get("size") or "length")
    if mixture:
        raise SortpackError("--oversize split: not supported for a mixture yet (use --oversize skip or truncate)")
    if size not in SPLIT_KINDS:
        raise SortpackError(f"--oversize split cuts token ids (--size tokens) or characters and list elements "
                            f"(--size length); --size {size} says how large a sample is but not where to cut it")


def piece_table(size: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (source row of each piece, its begin, its size) for samples of ``size`` cut into pieces of ``cap``.

    A sample of at most ``cap`` is one piece ``[0, size)``; a larger one is ``ceil(size / cap)``
    pieces, all of ``cap`` but the last.
    """
    size = np.asarray(size, dtype=np.int64)
    count = np.where(size > cap, -(-size // cap), 1)
    row = np.repeat(np.arange(len(size), dtype=np.int64), count)
    first = np.concatenate(([0], np.cumsum(count)))[:-1]
    ordinal = np.arange(len(row), dtype=np.int64) - np.repeat(first, count)
    begin = ordinal * cap
    return row, begin, np.minimum(size[row] - begin, cap)


def split_samples(comm: Comm, samples: SampleColumns, cap: int, over: np.ndarray) -> tuple[SampleColumns, dict]:
    """Return the samples with those in ``over`` cut into pieces of at most ``cap`` (numbered globally), and counts.

    The pieces of one sample stay together and in order, right where the sample was, so the
    order is (sample order, piece ordinal) and does not depend on the rank count. The counts
    (over all ranks): ``split`` samples cut, ``split_pieces`` pieces they became and
    ``split_tokens`` the units they hold. ``begin`` is set on every rank when any sample was cut.
    """
    count = comm.allreduce(int(over.sum()), "sum")
    info = {"split": count, "split_pieces": 0, "split_tokens": comm.allreduce(exact_sum(samples.size[over]), "sum")}
    if count == 0:
        return samples, info
    row, begin, size = piece_table(samples.size, cap)
    info["split_pieces"] = comm.allreduce(int(over[row].sum()), "sum")
    start, total = global_start(comm, len(row))
    difficulty = size if samples.difficulty is samples.size else samples.difficulty[row]
    stage = None if samples.stage is None else samples.stage[row]
    out = SampleColumns(start, total, samples.sample_id[row], size, difficulty, stage, samples.files,
                        samples.empty_size, begin)
    return out, info


def split_oversize(comm: Comm, samples: SampleColumns, opts) -> tuple[SampleColumns, dict]:
    """Return the samples with every one that fits no micro-batch alone cut into pieces (``opts``: PackOptions)."""
    from .pack.budget import oversize_mask, truncate_length

    return split_samples(comm, samples, truncate_length(opts), oversize_mask(opts, samples.size))
