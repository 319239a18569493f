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
depends on the text, which the sizes alone do not say: ``run`` places them while analyze
reads the text (``ByteCuts``, analyze's ``keep_pieces``), ``pack`` of a sorted directory reads
the oversize samples' values back from the input files (only the units that hold one); both
cut with ``inputs.pieces.byte_pieces``. Byte offsets are what ``piece_begin``/``piece_end``
then hold; a reader cuts the text's UTF-8 bytes at them.

The planning half (``piece_table``) takes arrays and no communicator; ``split_samples`` numbers
the pieces globally; ``split_targets`` counts the loss targets of fine-tuning data's pieces.
``run`` splits right after analyze, before the sort, so pieces are sorted by their own sizes;
``pack`` of a sorted directory splits and sorts again, in the same (key, sample id, begin) order
(``sort.sort_samples``), so every route gives ``run``'s plan.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..distribute import global_start
from ..errors import SortpackError
from ..inputs.measures import measure_of
from ..inputs.pieces import byte_pieces, longest_char, read_values
from ..inputs.size_kinds import split_kinds
from ..parallel import Comm
from .samples import SampleColumns, exact_sum

if TYPE_CHECKING:
    from .analyze import AnalyzeOptions
    from .pack import PackOptions
    from .plan_options import PlanOptions

# size kinds whose units a reader can cut (their ``SizeKind.ranges``): token ids, characters of a
# text, elements of a list, bytes of a text (at character boundaries) or binary value
SPLIT_KINDS = split_kinds()


def check_split(plan: PlanOptions, own_column: str | None = None, tokenizer: str | None = None) -> None:
    """Raise SortpackError when ``--oversize split`` cannot cut this plan's samples (one line, before any work).

    ``plan``: what the plan measures (``analyze``) and how it packs (``pack``). ``own_column``: a
    mixture source that reads its own column (``"name' reads 'column"``), which ``--size bytes``
    cannot cut yet. A budget whose pieces cannot hold a token beside the special tokens is
    refused too (``check_piece_room``): the recorded ``empty_size`` of a measured plan, else the
    one the ``tokenizer`` file's post-processor adds.
    """
    measured, popts = plan.analyze, plan.pack
    size = measured.size
    for name, spec in measured.measure_specs().items():
        option = measure_of(name).option
        if measure_of(name).pieces is None:  # a piece's share would be wrong: an image's patches stay whole
            raise SortpackError(f"--oversize split cuts a sample's size, not its {option} {spec}: use "
                                f"--oversize skip or error with {option}")
    if popts is not None and size == "tokens":
        empty = plan.empty_size
        if not empty and tokenizer and measured.special_tokens:
            from ..inputs.specs import load_tokenizer
            from .analyze import empty_token_count

            empty = empty_token_count(load_tokenizer(tokenizer))
        check_piece_room(popts, empty)
    if size not in SPLIT_KINDS:
        raise SortpackError(f"--oversize split cuts token ids (--size tokens), characters and list elements "
                            f"(--size length) or bytes at character boundaries (--size bytes); --size {size} "
                            "says how large a sample is but not where to cut it")
    if own_column and size == "bytes":
        # the character-boundary cuts are placed while analyze reads one column, or read back from it
        raise SortpackError(f"--oversize split with --size bytes: not supported yet for a mixture whose sources "
                            f"read different columns (source {own_column}); use --size length or --size tokens, "
                            "or --oversize skip or truncate")
    if size == "bytes" and not measured.column:
        # the store and the reader cut the column the manifest names: it must name one
        raise SortpackError("--oversize split with --size bytes needs --column (the text or binary column "
                            "whose bytes the pieces are cut from)")


def check_piece_room(popts: PackOptions, empty_size: int) -> None:
    """Raise SortpackError (one line) when a piece of ``popts``'s cap cannot hold a token beside the special tokens.

    Under ``--size tokens`` a text measures ``empty_size`` tokens with no content (the
    post-processor's ``[CLS]``/``[SEP]``, BOS/EOS). A document's first piece starts with the ones
    placed before the text: at a cap of ``empty_size`` or less it may hold those alone, a piece
    with no token to train on that packing then drops as empty. So the cap must exceed
    ``empty_size``: every first piece then holds at least one token of its document.
    """
    from .pack.fits import truncate_length

    if not empty_size:
        return
    cap = truncate_length(popts)
    if cap <= empty_size:
        where = f"--rows {popts.rows}" if popts.rows else f"--max-tokens {popts.max_tokens}"
        raise SortpackError(f"{where} with --oversize split: a piece holds at most {cap} tokens and the tokenizer "
                            f"adds {empty_size} special tokens to every text, so a document's first piece could hold "
                            f"none of its own tokens; raise the budget so that a piece holds at least "
                            f"{empty_size + 1} tokens (or count without them: --no-special-tokens)")


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


class ByteCuts:
    """The ``--size bytes`` cuts ``analyze`` places while it reads (``run``): its ``keep_pieces``.

    Called with each read's table and sizes, in the order of this rank's samples; keeps the
    pieces of every text over ``cap`` (by local sample position), so the split reads nothing
    back. A character longer than ``cap`` is kept as ``bad`` and refused by the split, where
    the sample's id is known.
    """

    def __init__(self, cap: int, column: str):
        self.cap, self.column = cap, column
        self.seen = 0  # samples measured so far on this rank
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.bad: tuple[int, int, str] | None = None  # (local position, character bytes, file)

    def __call__(self, table, size: np.ndarray, where: str) -> None:
        """Keep the pieces of this read's samples over ``cap``."""
        size = np.asarray(size)
        base = self.seen
        self.seen += len(size)
        if self.bad is not None or not bool(np.any(size > self.cap)):
            return
        at = 0  # the chunk's first row in this read
        for chunk in table.column(self.column).chunks:  # in place: only the oversize rows are read
            over = np.flatnonzero(size[at:at + len(chunk)] > self.cap)
            if over.size:
                try:
                    row, begin, piece = byte_pieces(chunk, self.cap, over)
                except ValueError:
                    where_at, width = longest_char(chunk.take(over))
                    self.bad = (base + at + int(over[where_at]), width, where)
                    return
                self.parts.append((base + at + row, begin, piece))
            at += len(chunk)

    def pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return (local position, begin, size) of every piece kept, in (position, begin) order."""
        if not self.parts:
            return _no_pieces()
        row, begin, size = (np.concatenate(x) for x in zip(*self.parts))
        return row, begin, size


def byte_cuts(measured: AnalyzeOptions, popts: PackOptions) -> ByteCuts | None:
    """Return the ``keep_pieces`` for ``analyze`` under ``--size bytes --oversize split`` (None otherwise)."""
    from .pack.fits import truncate_length

    if popts.oversize != "split" or measured.size != "bytes" or not measured.column:
        return None
    return ByteCuts(truncate_length(popts), measured.column)


def _no_pieces() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return an empty (row, begin, size)."""
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)


def _too_long(path: str, sample: int, width: int, cap: int) -> SortpackError:
    """Return the error for a sample holding a character longer than a piece may be."""
    return SortpackError(f"{path}: sample {sample} holds a character of {width} bytes, more than the {cap} bytes a "
                         f"piece holds (--size bytes --oversize split cuts only between characters; raise "
                         f"--max-tokens to at least {width} or use --oversize skip)")


def _read_back(samples: SampleColumns, cap: int, idx: np.ndarray, column: str
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (row, begin, size) of the pieces of samples ``idx``, their values read back from the input files."""
    ids = samples.sample_id[idx]
    order = np.argsort(ids, kind="stable")  # read in file order
    parts = []
    for pos, values, path in read_values(samples.files, ids[order], column):
        at = idx[order[pos]]
        _check_bytes(values, samples.size[at], samples.sample_id[at], path)
        try:
            row, begin, size = byte_pieces(values, cap)
        except ValueError:
            where, width = longest_char(values)
            raise _too_long(path, int(samples.sample_id[at[where]]), width, cap) from None
        parts.append((at[row], begin, size))
    if not parts:
        return _no_pieces()
    row, begin, size = (np.concatenate(x) for x in zip(*parts))
    return row, begin, size


def byte_piece_table(samples: SampleColumns, cap: int, over: np.ndarray, column: str,
                     known: ByteCuts | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``piece_table``'s (row, begin, size) under ``--size bytes``: the samples in ``over`` cut at
    character boundaries of their ``column`` values, the others whole.

    The cuts ``analyze`` placed (``known``, this rank's samples as analyze returned them) are
    used where they cover a sample; the other samples' values are read back from the input
    files. Raises one line where a sample holds a character longer than ``cap`` or changed since
    analyze.
    """
    idx = np.flatnonzero(over)
    parts = []
    if known is not None and known.seen == len(samples) and known.cap == cap:
        if known.bad is not None and over[known.bad[0]]:
            raise _too_long(known.bad[2], int(samples.sample_id[known.bad[0]]), known.bad[1], cap)
        row, begin, size = known.pieces()
        mine = over[row]
        parts.append((row[mine], begin[mine], size[mine]))
        idx = idx[np.bincount(row, minlength=len(over))[idx] == 0]  # over, but analyze did not cut them
    if idx.size:
        parts.append(_read_back(samples, cap, idx, column))
    over_row, over_begin, over_size = (np.concatenate(x) for x in zip(*parts)) if parts else _no_pieces()
    by = np.lexsort((over_begin, over_row))
    over_row, over_begin, over_size = over_row[by], over_begin[by], over_size[by]
    count = np.ones(len(samples.size), dtype=np.int64)
    cut = np.flatnonzero(over)
    count[cut] = np.bincount(over_row, minlength=len(count))[cut]
    row = np.repeat(np.arange(len(count), dtype=np.int64), count)
    begin = np.zeros(len(row), dtype=np.int64)
    size = np.asarray(samples.size, dtype=np.int64)[row]
    first = np.cumsum(count) - count
    slot = first[over_row] + np.arange(len(over_row)) - np.searchsorted(over_row, over_row)
    begin[slot], size[slot] = over_begin, over_size
    return row, begin, size


def _check_bytes(values, size: np.ndarray, sample_id: np.ndarray, path: str) -> None:
    """Raise one line where a value read back is not as long as analyze measured it (the input changed)."""
    from .. import arrow_compute as ac

    now = np.asarray(ac.fill_null(ac.binary_length(values), 0), dtype=np.int64)
    bad = np.flatnonzero(now != size)
    if bad.size:
        i = int(bad[0])
        raise SortpackError(f"{path}: sample {int(sample_id[i])} has {int(now[i])} bytes, the plan was analyzed "
                            f"from {int(size[i])} (the input changed since analyze)")


def _split_counts(comm: Comm, samples: SampleColumns, over: np.ndarray, row: np.ndarray | None,
                  mine: np.ndarray | None) -> dict:
    """Return the split's counts (over all ranks) of the samples ``mine`` (None: all): cut, pieces, units."""
    cut = over if mine is None else over & mine
    pieces = 0 if row is None else int(cut[row].sum())
    return {"split": comm.allreduce(int(cut.sum()), "sum"), "split_pieces": comm.allreduce(pieces, "sum"),
            "split_tokens": comm.allreduce(exact_sum(samples.size[cut]), "sum")}


@dataclass(frozen=True)
class PieceCut:
    """How samples over the budget are cut: into pieces of at most ``cap`` units; under ``--size bytes`` at
    character boundaries of ``column``'s values (``known``: the cuts analyze placed, ``ByteCuts``)."""

    cap: int
    column: str | None = None
    known: ByteCuts | None = None


def split_samples(comm: Comm, samples: SampleColumns, over: np.ndarray, cut: PieceCut,
                  held_out: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[SampleColumns, dict]:
    """Return the samples with those in ``over`` cut into pieces (``cut``, numbered globally), and counts.

    The pieces of one sample stay together and in order, right where the sample was, so the
    order is (sample order, piece ordinal) and does not depend on the rank count. The counts
    (over all ranks): ``split`` samples cut, ``split_pieces`` pieces they became and
    ``split_tokens`` the units they hold. ``begin`` is set on every rank when any sample was cut.
    ``held_out`` (a plan with a held-out part: which of these sample ids it holds out): the
    counts are the training plan's documents only, and ``info["held"]`` holds the held-out plan's.
    """
    cap, column, known = cut.cap, cut.column, cut.known
    count = comm.allreduce(int(over.sum()), "sum")
    held = None if held_out is None else held_out(samples.sample_id)
    row = None
    if count and column is not None and samples.begin is not None:  # every rank sees the same count
        raise SortpackError(f"{count} pieces of a sorted directory are over the budget: pieces cut at character "
                            "boundaries (--size bytes) are not cut again; pack with the budget they were cut for, "
                            "or sort and pack the metrics", collective=True)
    if count:
        if column is None:
            row, begin, size = piece_table(samples.size, cap)
        else:
            row, begin, size = comm.collectively(byte_piece_table, samples, cap, over, column, known)
    if samples.begin is not None:  # pieces already (a sorted directory run wrote): counted by their ids
        return _cut_again(comm, samples, (row, begin, size) if row is not None else None, held)
    info = _split_counts(comm, samples, over, row, None if held is None else ~held)
    if held is not None:
        info["held"] = _split_counts(comm, samples, over, row, held)
    if row is None:
        return samples, info
    return _pieces(comm, samples, row, begin, size), info


def _cut_again(comm: Comm, samples: SampleColumns, table: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
               held: np.ndarray | None) -> tuple[SampleColumns, dict]:
    """Return pieces cut again by ``table`` (None: none was over) and the split's counts of the documents they hold.

    The counts are those ``run`` gives: a document counts as cut when it has more than one piece
    (``piece_counts``), whether this split or the one that wrote the sorted directory cut it.
    """
    out = samples if table is None else _pieces(comm, samples, *table)
    kept = None if held is None else (held if table is None else held[table[0]])
    info = piece_counts(comm, out.sample_id, out.size, None if kept is None else ~kept)
    if kept is not None:
        info["held"] = piece_counts(comm, out.sample_id, out.size, kept)
    return out, info


def piece_counts(comm: Comm, sample_id: np.ndarray, size: np.ndarray, mine: np.ndarray | None = None) -> dict:
    """Return the split's counts (over all ranks) of pieces ``mine`` (None: all): documents with more than one
    piece, their pieces and the units those hold.

    The pieces of one document may lie on any rank (a sorted directory orders them by size), so
    each is sent to the rank that owns its id's range first: one Alltoallv of two int64 per piece.
    """
    if mine is not None:
        sample_id, size = sample_id[mine], size[mine]
    top = comm.allreduce(int(sample_id.max()) + 1 if len(sample_id) else 0, "max")
    owner = (np.asarray(sample_id, dtype=np.int64) // -(-max(top, 1) // comm.size)).astype(np.int64)
    order = np.argsort(owner, kind="stable")
    got = comm.alltoallv_many({"id": np.asarray(sample_id, np.int64)[order], "size": np.asarray(size, np.int64)[order]},
                              np.bincount(owner, minlength=comm.size))
    _, inverse, count = np.unique(got["id"], return_inverse=True, return_counts=True)
    cut = count > 1
    of_cut = cut[inverse]
    return {"split": comm.allreduce(int(cut.sum()), "sum"), "split_pieces": comm.allreduce(int(of_cut.sum()), "sum"),
            "split_tokens": comm.allreduce(exact_sum(got["size"][of_cut]), "sum")}


def _pieces(comm: Comm, samples: SampleColumns, row: np.ndarray, begin: np.ndarray, size: np.ndarray) -> SampleColumns:
    """Return the pieces ``(row, begin, size)`` of ``samples`` (``piece_table``'s), numbered globally."""
    start, total = global_start(comm, len(row))
    if samples.begin is not None:  # a piece cut again: its begin counts in its document
        begin = samples.begin[row] + begin
    difficulty = size if samples.difficulty is samples.size else samples.difficulty[row]
    stage = None if samples.stage is None else samples.stage[row]
    # every measure a cut sample carries takes its share (``measure_of(name).pieces``: a measure whose pieces are
    # recounted from the labels, ``targets``, gets its own count after, ``split_targets.TargetPieces.exact``; one
    # that cannot be cut was refused before, ``check_split``)
    measures = {name: apportion(values, samples, row, begin, size) for name, values in samples.measures.items()}
    return SampleColumns(start, total, samples.sample_id[row], size, difficulty, stage, samples.files,
                         samples.empty_size, begin, measures)


def apportion(values: np.ndarray, samples: SampleColumns, row: np.ndarray, begin: np.ndarray,
              size: np.ndarray) -> np.ndarray:
    """Return each piece's share of its sample's measure, in proportion to the units it holds (int64).

    Piece ``[b, e)`` of a sample of size S and measure M gets ``floor(M*e/S) - floor(M*b/S)``:
    the shares of a sample's pieces sum to M exactly. A sample that was not cut keeps M
    (``begin`` 0, ``size`` S). ``values`` are the measure per sample (rows of ``samples``).
    """
    whole = samples.size[row].astype(np.int64)
    m = values[row].astype(np.int64)
    # the piece's start within what the measure covers (a sample already a piece starts at its own begin)
    start = begin if samples.begin is None else begin - samples.begin[row]
    span = np.maximum(whole, 1)
    return (m * (start + size)) // span - (m * start) // span


def split_oversize(comm: Comm, samples: SampleColumns, plan: PlanOptions, known: ByteCuts | None = None,
                   held_out: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[SampleColumns, dict]:
    """Return the samples with every one that fits no micro-batch alone cut into pieces (by ``plan.pack``).

    ``plan.analyze``: what the plan measured (``size``, ``column``); under ``--size bytes`` the
    cuts fall on character boundaries of the column's values (``known``: those ``analyze``
    placed while it read them, ``byte_cuts``; others are read back). ``held_out``: as for
    ``split_samples`` (the counts of each plan apart).
    """
    from .pack.fits import oversize_mask, truncate_length

    opts = plan.pack
    assert opts is not None, "split_oversize cuts by the pack options"
    check_piece_room(opts, samples.empty_size)  # on every rank together: empty_size is the job's
    measured = plan.analyze
    column = str(measured.column) if measured.size == "bytes" else None
    return split_samples(comm, samples, oversize_mask(opts, samples.size),
                         PieceCut(truncate_length(opts), column, known), held_out)
