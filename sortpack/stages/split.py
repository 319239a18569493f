"""``--oversize split``: a sample over the budget becomes consecutive pieces that each fit.

A piece is a plan sample: the source sample id plus its range ``[begin, begin + size)`` in the
unit the size counts (token ids as the tokenizer returns them, special tokens included, under
``--size tokens``; characters of a text or elements of a list under ``length``; bytes under
``bytes``). Every piece but the last holds ``cap`` units, the largest length that fits a
micro-batch alone (``truncate_length``); the last holds the rest. So a document's pieces cover
its units exactly once, in order, and the special tokens stay once where the tokenizer put them
(the first piece starts with ``[CLS]``, the last ends with ``[SEP]``).

Under ``--size bytes`` a text is cut only at UTF-8 character boundaries, so a piece holds the
longest run of whole characters that fits ``cap`` (up to 3 bytes less): where the cuts fall
depends on the text, which the sizes alone do not say, so ``byte_piece_table`` reads the
oversize samples' values back from the input files (only the units that hold one) and places
the cuts there (``inputs.pieces.byte_pieces``). Byte offsets are what ``piece_begin``/``piece_end``
then hold; a reader cuts the text's UTF-8 bytes at them.

The planning half (``piece_table``) takes arrays and no communicator; ``split_samples`` numbers
the pieces globally. ``run`` splits right after analyze, before the sort, so pieces are sorted
by their own sizes; ``pack`` of a sorted directory splits and sorts again (``sort.sort_pieces``).
"""
from __future__ import annotations

import numpy as np

from ..distribute import global_start
from ..errors import SortpackError
from ..inputs.pieces import byte_pieces, longest_char, read_values
from ..parallel import Comm
from .samples import SampleColumns, exact_sum

# size kinds whose units a reader can cut: token ids, characters of a text, elements of a list,
# bytes of a text (at character boundaries) or binary value
SPLIT_KINDS = ("tokens", "length", "bytes")


def check_split(options: dict, mixture: bool = False) -> None:
    """Raise SortpackError when ``--oversize split`` cannot cut this plan's samples (one line, before any work)."""
    size = str(options.get("size") or "length")
    if mixture:
        raise SortpackError("--oversize split: not supported for a mixture yet (use --oversize skip or truncate)")
    if size not in SPLIT_KINDS:
        raise SortpackError(f"--oversize split cuts token ids (--size tokens), characters and list elements "
                            f"(--size length) or bytes at character boundaries (--size bytes); --size {size} "
                            "says how large a sample is but not where to cut it")
    if size == "bytes" and not options.get("column"):
        # the store and the reader cut the column the manifest names: it must name one
        raise SortpackError("--oversize split with --size bytes needs --column (the text or binary column "
                            "whose bytes the pieces are cut from)")


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


def byte_piece_table(samples: SampleColumns, cap: int, over: np.ndarray, column: str
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``piece_table``'s (row, begin, size) under ``--size bytes``: the samples in ``over`` cut at
    character boundaries of their ``column`` values, read back from the input files; the others whole.

    Raises one line where a sample holds a character longer than ``cap`` or changed since analyze.
    """
    idx = np.flatnonzero(over)
    ids = samples.sample_id[idx]
    order = np.argsort(ids, kind="stable")  # read in file order
    got = [np.zeros(0, np.int64)] * 3
    parts: list[list[np.ndarray]] = [[], [], []]
    for pos, values, path in read_values(samples.files, ids[order], column):
        at = idx[order[pos]]
        _check_bytes(values, samples.size[at], samples.sample_id[at], path)
        try:
            row, begin, size = byte_pieces(values, cap)
        except ValueError:
            where, width = longest_char(values)
            raise SortpackError(f"{path}: sample {int(samples.sample_id[at[where]])} holds a character of {width} "
                                f"bytes, more than the {cap} bytes a piece holds (--size bytes --oversize split "
                                f"cuts only between characters; raise --max-tokens to at least {width} or use "
                                "--oversize skip)") from None
        for part, x in zip(parts, (at[row], begin, size)):
            part.append(x)
    if idx.size:
        got = [np.concatenate(p) for p in parts]
        by = np.lexsort((got[1], got[0]))
        got = [x[by] for x in got]
    over_row, over_begin, over_size = got
    count = np.ones(len(samples.size), dtype=np.int64)
    count[idx] = np.bincount(over_row, minlength=len(count))[idx]
    row = np.repeat(np.arange(len(count), dtype=np.int64), count)
    begin = np.zeros(len(row), dtype=np.int64)
    size = np.asarray(samples.size, dtype=np.int64)[row]
    first = np.cumsum(count) - count
    slot = first[over_row] + np.arange(len(over_row)) - np.searchsorted(over_row, over_row)
    begin[slot], size[slot] = over_begin, over_size
    return row, begin, size


def _check_bytes(values, size: np.ndarray, sample_id: np.ndarray, path: str) -> None:
    """Raise one line where a value read back is not as long as analyze measured it (the input changed)."""
    import pyarrow.compute as pc

    now = np.asarray(pc.binary_length(values).fill_null(0), dtype=np.int64)
    bad = np.flatnonzero(now != size)
    if bad.size:
        i = int(bad[0])
        raise SortpackError(f"{path}: sample {int(sample_id[i])} has {int(now[i])} bytes, the plan was analyzed "
                            f"from {int(size[i])} (the input changed since analyze)")


def split_samples(comm: Comm, samples: SampleColumns, cap: int, over: np.ndarray,
                  column: str | None = None) -> tuple[SampleColumns, dict]:
    """Return the samples with those in ``over`` cut into pieces of at most ``cap`` (numbered globally), and counts.

    The pieces of one sample stay together and in order, right where the sample was, so the
    order is (sample order, piece ordinal) and does not depend on the rank count. The counts
    (over all ranks): ``split`` samples cut, ``split_pieces`` pieces they became and
    ``split_tokens`` the units they hold. ``begin`` is set on every rank when any sample was cut.
    ``column`` (``--size bytes``): the column whose bytes are cut at character boundaries.
    """
    count = comm.allreduce(int(over.sum()), "sum")
    info = {"split": count, "split_pieces": 0, "split_tokens": comm.allreduce(exact_sum(samples.size[over]), "sum")}
    if count == 0:
        return samples, info
    if column is None:
        row, begin, size = piece_table(samples.size, cap)
    else:
        row, begin, size = comm.collectively(byte_piece_table, samples, cap, over, column)
    info["split_pieces"] = comm.allreduce(int(over[row].sum()), "sum")
    start, total = global_start(comm, len(row))
    difficulty = size if samples.difficulty is samples.size else samples.difficulty[row]
    stage = None if samples.stage is None else samples.stage[row]
    out = SampleColumns(start, total, samples.sample_id[row], size, difficulty, stage, samples.files,
                        samples.empty_size, begin)
    return out, info


def split_oversize(comm: Comm, samples: SampleColumns, opts, measured: dict | None = None
                   ) -> tuple[SampleColumns, dict]:
    """Return the samples with every one that fits no micro-batch alone cut into pieces (``opts``: PackOptions).

    ``measured``: the plan's recorded analyze options (``size``, ``column``); under ``--size
    bytes`` the cuts fall on character boundaries of the column's values.
    """
    from .pack.budget import oversize_mask, truncate_length

    column = None
    if measured is not None and measured.get("size") == "bytes":
        column = str(measured["column"])
    return split_samples(comm, samples, truncate_length(opts), oversize_mask(opts, samples.size), column)
