"""Stage 1: read the inputs in parallel and measure every sample's size and difficulty."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
import pyarrow as pa

from ..errors import SortpackError
from ..inputs import objects
from ..inputs.discover import expand_inputs
from ..inputs.fingerprints import record
from ..inputs.formats import file_columns, open_source, read_unit_rows, read_units, reader_for
from ..inputs.measures import measure_of
from ..inputs.megatron import holds_token_ids
from ..inputs.size_kinds import reads_text
from ..inputs.source_file import SourceFile
from ..inputs.specs import RowError, Spec, as_difficulty, as_size, evaluate, load_function, load_tokenizer, parse_spec
from ..parallel import Comm
from ..partition import even_range
from ..progress import Display, Progress
from .analyze_options import AnalyzeOptions
from .read_plan import Read, ReadPlan, plan_reads
from .samples import SampleColumns

if TYPE_CHECKING:
    from ..inputs.finetune import Encoded, FineTuneShape
    from ..inputs.row_names import Rows


@dataclass
class Specs:
    """The parsed size and difficulty SPECs and what evaluating them needs."""

    size: Spec
    difficulty: Spec | None  # None: the difficulty is the size
    tokenizer: Any = None  # loaded when a SPEC counts tokens
    funcs: dict[str, Callable] = field(default_factory=dict)  # python:MODULE:FUNC SPECs by text
    shape: FineTuneShape | None = None  # fine-tuning data: how its ids, labels and targets are made
    measures: dict[str, Spec] = field(default_factory=dict)  # per-sample measures measured like a size
    special_tokens: bool = True  # tokens: count the ones the post-processor adds

    def read_columns(self) -> tuple[list[str] | None, list[str]]:
        """Return (the columns a read needs, None for all; the text columns among them)."""
        specs = [s for s in (self.size, self.difficulty, *self.measures.values()) if s]
        if self.shape is not None and self.shape.encodes_text:  # the shape measures the size itself
            specs = [s for s in specs if s is not self.size]
        shaped = self.shape.columns() if self.shape is not None else []
        columns = sorted({c for s in specs for c in (s.columns() or []) if c} | set(shaped)) or None
        if any(s.kind == "python" for s in specs):
            columns = None
        text = {s.column for s in specs if reads_text(s.kind) and s.column}
        text |= set(self.shape.text_columns()) if self.shape is not None else set()
        return columns, sorted(text)


class TokenKeeper(Protocol):
    """Where ``run --store-tokens`` keeps the token ids of the encode that counts ``--size tokens``."""

    def count_and_keep(self, table: pa.Table, column: str, tokenizer: Any, where: str) -> np.ndarray:
        """Return the token counts of ``column``'s values (the sizes) and keep their ids."""
        ...

    def keep_encoded(self, encoded: Encoded) -> None:
        """Keep the ids and labels of a read of fine-tuning data (``FineTuneShape.encode``)."""
        ...


class PieceKeeper(Protocol):
    """Where ``run --size bytes --oversize split`` cuts the oversize texts of each read (``split.ByteCuts``)."""

    def __call__(self, table: pa.Table, size: np.ndarray, where: str) -> None:
        """Keep the cuts of this read's samples over the budget (rows in this rank's sample order)."""
        ...


class Keepers(NamedTuple):
    """What a job keeps of each read besides its measures: the token ids (``tokens``) and the cuts of the
    oversize texts (``pieces``); see ``analyze``."""

    tokens: TokenKeeper | None = None
    pieces: PieceKeeper | None = None


@dataclass
class Measured:
    """What one rank measured: its sizes and difficulties per read, and the rows of units without row counts."""

    sizes: list[np.ndarray]
    diffs: list[np.ndarray]
    unknown_rows: list[int]
    measures: dict[str, list[np.ndarray]] = field(default_factory=dict)  # per measure name, read by read
    whole: np.ndarray | None = None  # every read's sizes, already in one array (``sizes`` are views of it)
    roles: frozenset[str] = frozenset()  # the roles of the chats' messages (chats only)


def _describe_all(comm: Comm, inputs: list[str], input_format: str, split: str | None = None) -> list[SourceFile]:
    """Return every input file's description (units, rows per unit), the same list on every rank."""
    paths = comm.collectively(lambda: expand_inputs(inputs, input_format, split) if comm.is_root() else None)
    paths = comm.bcast_obj(paths)
    # Metadata reads are spread over ranks: a cluster job may name thousands of files, and
    # each rank opens only its contiguous slice of them; the small descriptions (row counts
    # per row group) are then shared with one allgather.
    lo, hi = even_range(len(paths), rank=comm.rank, size=comm.size)
    mine = comm.collectively(lambda: [open_source(p, f) for p, f in _prefetched(paths[lo:hi])])
    return [src for part in comm.allgather_obj(mine) for src in part]


def _prefetched(paths: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Return ``paths`` once the objects among them are fetched at once (small ones whole: ``objects.prefetch``)."""
    objects.prefetch([p for p, _ in paths])
    return paths


def _resolve_column(opts: AnalyzeOptions, files: list[SourceFile]) -> str | None:
    """Return the column the text SPECs read: ``--column``, the only column, ``text``, or None."""
    if opts.column:
        return opts.column
    # an empty jsonl/csv shard has no columns to choose from: look at the next file
    names = next((n for n in map(file_columns, files) if n), [])
    if len(names) == 1:
        return names[0]
    if "text" in names:
        return "text"
    return None


def _parse_specs(opts: AnalyzeOptions, files: list[SourceFile]) -> Specs:
    """Return the parsed SPECs, the tokenizer they need, their python functions and the fine-tuning shape."""
    opts.validate()
    if opts.shape is not None:
        return _fine_tune_specs(opts, files)
    needs_column = reads_text(opts.size, opts.difficulty or opts.size)
    column = _resolve_column(opts, files) if needs_column else opts.column
    size_spec = parse_spec(opts.size, column, "--size")
    diff_spec = parse_spec(opts.difficulty, column, "--difficulty") if opts.difficulty else None
    extra = opts.measure_specs()
    if reads_text(*extra.values()):
        column = column or _resolve_column(opts, files)
    measures = {name: parse_spec(text, column, measure_of(name).option) for name, text in extra.items()}
    tokenizer = None
    kinds = [("--size", size_spec), ("--difficulty", diff_spec)] + [(measure_of(n).option, m)
                                                                    for n, m in measures.items()]
    wants = [option for option, spec in kinds if spec is not None and spec.kind == "tokens"]
    if wants and not (opts.tokenizer is None and holds_token_ids(files)):
        tokenizer = load_tokenizer(opts.tokenizer, wants[0])
    funcs = {s.text: load_function(s) for _, s in kinds if s and s.kind == "python"}
    return Specs(size_spec, diff_spec, tokenizer, funcs, measures=measures, special_tokens=opts.special_tokens)


def _fine_tune_specs(opts: AnalyzeOptions, files: list[SourceFile]) -> Specs:
    """Return the SPECs of fine-tuning data: the size is the ids' length (labels column) or the encoded tokens."""
    assert opts.shape is not None
    tokenizer = load_tokenizer(opts.tokenizer, "--size") if opts.text_shape or opts.tokenizer else None
    # what the files decide (the end token of TRL pairs) may not be resolved yet: analyze called as a library
    shape = opts.shape.resolved(opts.tokenizer).loaded(tokenizer)
    column = shape.columns()[0]
    size_spec = parse_spec(opts.size, column, "--size")
    diff_spec = parse_spec(opts.difficulty, column, "--difficulty") if opts.difficulty else None
    measures = {name: parse_spec(text, column, measure_of(name).option)
                for name, text in opts.measure_specs().items()}
    kinds = [size_spec, diff_spec, *measures.values()]
    if tokenizer is None and any(s is not None and s.kind == "tokens" for s in kinds) and \
            not (opts.tokenizer is None and holds_token_ids(files)):
        tokenizer = load_tokenizer(opts.tokenizer, "--size")
    funcs = {s.text: load_function(s) for s in kinds if s and s.kind == "python"}
    return Specs(size_spec, diff_spec, tokenizer, funcs, shape, measures, opts.special_tokens)


def analyze(comm: Comm, inputs: list[str], opts: AnalyzeOptions, show_progress: bool = False,
            keep: Keepers | None = None) -> SampleColumns:
    """Return this rank's slice of (sample_id, size, difficulty) for the inputs.

    Ranks read the parts ``read_plan.plan_reads`` deals them: disjoint contiguous runs of
    units balanced by rows, so each rank's samples are a contiguous range of global ids.

    ``keep.tokens`` (``run --store-tokens``) changes how ``--size tokens`` is counted, not
    what: its ``count_and_keep`` counts each read's tokens (the sizes, the same counts) and
    keeps the ids of that one encode for the store. Other SPECs never use it.
    ``keep.pieces`` (``run --size bytes --oversize split``: ``split.ByteCuts``) sees each read's
    table with its sizes, in sample order, to cut the oversize texts while they are in memory;
    it changes nothing that is measured.
    """
    files = _describe_all(comm, inputs, opts.input_format, opts.split)
    specs: Specs = comm.collectively(_parse_specs, opts, files)
    plan = plan_reads(files, rank=comm.rank, size=comm.size)
    # what pack --store checks later: each file's mtime and digest, taken before it is read
    digests = record(comm, [f.path for f in files], [f.format for f in files], [f.bytes for f in files],
                     plan.file_owners)
    show = Display(show_progress and comm.is_root(), comm.size)
    prog = Progress("analyze", plan.rows, "rows", plan.total_rows, show)
    measured: Measured = comm.collectively(_measure, files, plan, specs, keep or Keepers(), prog)
    if specs.shape is not None:  # chats: --train-on a role no message has would train nothing
        specs.shape.check_roles(frozenset().union(*comm.allgather_obj(measured.roles)))
    unit_rows = _share_unit_rows(comm, plan, measured.unknown_rows)
    start = int(unit_rows[:plan.lo].sum()) + plan.head
    total = int(unit_rows.sum())
    if total == 0:  # every rank sees the same total: all raise together
        names = ", ".join(inputs[:3]) + (f" and {len(inputs) - 3} more" if len(inputs) > 3 else "")
        raise SortpackError(f"{names}: the input holds no rows", collective=True)
    file_rows = np.bincount(plan.units.file, weights=unit_rows, minlength=len(files)).astype(np.int64)
    fingerprint = [{**f.fingerprint(r), **d} for f, r, d in zip(files, file_rows, digests)]
    size, diff = _columns(comm, measured, specs)
    # the per-read pieces are copied into the columns: free them first, so the ids take their memory
    measured.sizes.clear()
    measured.diffs.clear()
    sample_id = np.arange(start, start + len(size), dtype=np.int64)
    # (fine-tuning texts: a sample without content is one without targets, not one of the empty text's size)
    counts_text = specs.size.kind == "tokens" and specs.shape is None and specs.tokenizer is not None
    empty_size = empty_token_count(specs.tokenizer) if counts_text and opts.special_tokens else 0
    measured_names = [*specs.measures, *(["targets"] if specs.shape is not None else [])]
    measures = {name: np.concatenate(measured.measures[name]) if measured.measures.get(name)
                else np.zeros(0, np.int64) for name in measured_names}
    return SampleColumns(start, total, sample_id, size, diff, None, fingerprint, empty_size, measures=measures)


def _measure(files: list[SourceFile], plan: ReadPlan, specs: Specs, keep: Keepers, prog: Progress) -> Measured:
    """Return this rank's sizes and difficulties, read by read, and the rows of the units it found."""
    columns, text_columns = specs.read_columns()
    counter = "tokens" if specs.size.kind == "tokens" else "summed size"  # the progress line's running sum
    out = Measured([], [], [])
    keep_pieces = keep.pieces
    # where every unit's rows are known, the sizes land in one array as they are read: no pieces held
    # until a concatenation, which would be a second copy as large in fresh memory
    known = plan.rows > 0 and not plan.units.unknown[plan.lo:plan.hi + 1].any()
    whole = np.empty(plan.rows, np.int64) if known else None
    filled = 0
    for read in plan.reads:
        src = files[read.file]
        table = _read(src, read, columns, text_columns)
        if src.unit_rows is None:
            out.unknown_rows.append(table.num_rows)
        if table.num_rows == 0:
            # an empty file or row group: its columns may not even exist (empty jsonl)
            continue
        try:
            size, diff, encoded = _measure_table(table, _rows_of(src, read), specs, keep.tokens)
            extra = {name: as_size(evaluate(spec, table, src.path, specs.tokenizer, specs.funcs.get(spec.text),
                                            specs.special_tokens), src.path, f"{measure_of(name).option} {spec.text}")
                     for name, spec in specs.measures.items()}
        except RowError as exc:  # a media header: named by its row of the file
            raise exc.at(_first_row(src, read), partial(reader_for(src.format).row_position, src)) from None
        if encoded is not None:
            out.measures.setdefault("targets", []).append(encoded.targets)
            out.roles |= encoded.roles or frozenset()
            keep_labels = getattr(keep_pieces, "keep_labels", None)  # split.TargetPieces: pieces' own targets
            if keep_labels is not None:
                keep_labels(encoded.labels, size)
        if keep_pieces is not None:
            keep_pieces(table, size, src.path)
        kept = size
        if whole is not None and size.dtype == whole.dtype and filled + len(size) <= len(whole):
            kept = whole[filled:filled + len(size)]
            kept[...] = size
            filled += len(size)
        else:
            whole = None  # a read the rows did not foresee: the pieces are concatenated
        out.sizes.append(kept)
        out.diffs.append(kept if diff is size else diff)
        for name, values in extra.items():
            out.measures.setdefault(name, []).append(values.astype(np.int64, copy=False))
        prog.update(table.num_rows, None, **{counter: int(size.sum())})
    prog.close()
    out.whole = None if whole is None else whole[:filled]
    return out


def _first_row(src: SourceFile, read: Read) -> int:
    """Return the row of its file at which a read begins."""
    before = sum(src.unit_rows[:read.first]) if src.unit_rows is not None else 0
    return int(before) + (read.row_lo or 0)


def _read(src: SourceFile, read: Read, columns: list[str] | None, text_columns: list[str]) -> pa.Table:
    """Return the rows of one read, checked against the rows the metadata promised."""
    if read.row_lo is None or read.row_hi is None:
        table = read_units(src, read.first, read.end, columns, text_columns)
        expect = sum(src.unit_rows[read.first:read.end]) if src.unit_rows is not None else None
    else:
        table = read_unit_rows(src, read.first, range(read.row_lo, read.row_hi), columns, text_columns)
        expect = read.row_hi - read.row_lo
    if src.unit_rows is not None and expect != table.num_rows:
        raise SortpackError(f"{src.path}: read {table.num_rows} rows, metadata says {expect}")
    return table


def _rows_of(src: SourceFile, read: Read) -> Rows:
    """Return how error lines name the rows of one read: its file, its first row there, the format's words for a row
    (a JSONL file's line)."""
    from ..inputs.row_names import Rows

    return Rows(src.path, _first_row(src, read), partial(reader_for(src.format).row_position, src))


def _measure_table(table: pa.Table, rows: Rows, specs: Specs,
                   keep_tokens: TokenKeeper | None) -> tuple[np.ndarray, np.ndarray, Encoded | None]:
    """Return the (size, difficulty, encoded ids and labels) of every row of ``table`` (``rows``: where they are).

    The difficulty is the same array as the size when it is the size; the encoding is None
    unless the rows are fine-tuning data (its ``targets`` are their measure).
    """
    size_spec, diff_spec = specs.size, specs.difficulty
    encoded = None
    shape = specs.shape
    where = rows.path
    if shape is not None:
        encoded = shape.encode(table, rows)  # checks a labels column against its ids too
        if shape.encodes_text:
            if keep_tokens is not None:
                keep_tokens.keep_encoded(encoded)
            size = encoded.sizes
            return size, size if diff_spec is None else _difficulty(table, where, specs), encoded
    if keep_tokens is not None and size_spec.kind == "tokens":
        assert size_spec.column is not None  # parse_spec gives a tokens SPEC its column
        size = keep_tokens.count_and_keep(table, size_spec.column, specs.tokenizer, where)
    else:
        size = as_size(evaluate(size_spec, table, where, specs.tokenizer, specs.funcs.get(size_spec.text),
                                specs.special_tokens), where, f"--size {size_spec.text}")
    if diff_spec is None:
        return size, size, encoded
    return size, _difficulty(table, where, specs), encoded


def _difficulty(table: pa.Table, where: str, specs: Specs) -> np.ndarray:
    """Return the ``--difficulty`` SPEC's value per row of ``table``."""
    spec = specs.difficulty
    assert spec is not None
    return as_difficulty(evaluate(spec, table, where, specs.tokenizer, specs.funcs.get(spec.text),
                                  specs.special_tokens), where, f"--difficulty {spec.text}")


def _share_unit_rows(comm: Comm, plan: ReadPlan, found_rows: list[int]) -> np.ndarray:
    """Return every unit's rows (every rank): the rows of whole-file units are known only once read."""
    unit_rows = plan.units.rows.copy()
    # (unknown units are never cut, and each is read by exactly the rank whose run starts at it)
    mine = np.flatnonzero(plan.units.unknown[plan.lo:plan.hi]) + plan.lo
    for part in comm.allgather_obj([(int(u), r) for u, r in zip(mine, found_rows)]):
        for u, r in part:
            unit_rows[u] = r
    return unit_rows


def _columns(comm: Comm, measured: Measured, specs: Specs) -> tuple[np.ndarray, np.ndarray]:
    """Return this rank's size and difficulty columns, the difficulty in the dtype every rank uses."""
    if measured.whole is not None:
        size = measured.whole
    else:
        size = np.concatenate(measured.sizes) if measured.sizes else np.empty(0, np.int64)
    diff_dtype = _common_dtype(comm, measured.diffs)
    if specs.difficulty is None:
        return size, size  # the same array: later stages see it and move nothing twice
    diffs = measured.diffs
    return size, np.concatenate(diffs).astype(diff_dtype, copy=False) if diffs else np.empty(0, diff_dtype)


def empty_token_count(tokenizer) -> int:
    """Return the tokens an empty text measures with special tokens on (the post-processor's, e.g. 2).

    One encode of the empty string, once per job: a sample whose measured size is no more than
    this has no content (``stages.pack.fits.content_empty``), so no second encode per sample.
    """
    return len(tokenizer.encode("", add_special_tokens=True).ids)


def _common_dtype(comm: Comm, parts: list[np.ndarray]) -> np.dtype:
    """Return the difficulty dtype every rank uses: float64 if any rank measured floats, else int64."""
    # One rank may see only integer values where another sees floats; all must agree.
    is_float = any(p.dtype.kind == "f" for p in parts)
    return np.dtype(np.float64) if comm.allreduce(int(is_float), "max") else np.dtype(np.int64)
