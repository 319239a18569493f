"""Stage 1: read the inputs in parallel and measure every sample's size and difficulty."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SortpackError
from ..inputs.discover import expand_inputs
from ..inputs.fingerprints import record
from ..inputs.formats import file_columns, open_source, read_unit_rows, read_units
from ..inputs.source_file import SourceFile
from ..inputs.specs import Spec, as_difficulty, as_size, evaluate, load_function, load_tokenizer, parse_spec
from ..parallel import Comm
from ..partition import split_rows
from ..progress import Progress
from .samples import SampleColumns

_TEXT_KINDS = ("length", "bytes", "words", "tokens")


@dataclass
class AnalyzeOptions:
    """What to measure: the column and the size/difficulty SPECs."""

    column: str | None = None
    size: str = "length"
    difficulty: str | None = None
    tokenizer: str | None = None
    input_format: str = "auto"
    special_tokens: bool = True  # tokens: count the ones the post-processor adds
    split: str | None = None  # the split of a Hugging Face DatasetDict directory

    def as_dict(self) -> dict:
        """Return the options as recorded in manifests (tokenizer by file name only).

        ``special_tokens`` is recorded when a SPEC counts tokens and ``split`` when given,
        so the manifests of runs that use neither keep their content hash.
        """
        out: dict[str, Any] = {"column": self.column, "size": self.size, "difficulty": self.difficulty or self.size,
               "tokenizer": None if not self.tokenizer else str(self.tokenizer).rsplit("/", 1)[-1],
               "input_format": self.input_format}
        if "tokens" in (self.size, self.difficulty):
            out["special_tokens"] = self.special_tokens
        if self.split is not None:
            out["split"] = self.split
        return out


@dataclass
class Specs:
    """The parsed size and difficulty SPECs and what evaluating them needs."""

    size: Spec
    difficulty: Spec | None  # None: the difficulty is the size
    tokenizer: Any = None  # loaded when a SPEC counts tokens
    funcs: dict[str, Callable] = field(default_factory=dict)  # python:MODULE:FUNC SPECs by text


@dataclass
class Read:
    """One read of a rank's run: units ``[first, end)`` of file ``file``, or rows ``[row_lo, row_hi)`` of one unit."""

    file: int
    first: int
    end: int
    row_lo: int | None = None  # set (with row_hi) when the read takes part of a unit
    row_hi: int | None = None


@dataclass
class Measured:
    """What one rank measured: its sizes and difficulties per read, and the rows of units without row counts."""

    sizes: list[np.ndarray]
    diffs: list[np.ndarray]
    unknown_rows: list[int]


def _describe_all(comm: Comm, inputs: list[str], input_format: str, split: str | None = None) -> list[SourceFile]:
    """Return every input file's description (units, rows per unit), the same list on every rank."""
    paths = comm.collectively(lambda: expand_inputs(inputs, input_format, split) if comm.is_root() else None)
    paths = comm.bcast_obj(paths)
    # Metadata reads are spread over ranks: a cluster job may name thousands of files, and
    # each rank opens only its contiguous slice of them; the small descriptions (row counts
    # per row group) are then shared with one allgather.
    lo, hi = (len(paths) * comm.rank) // comm.size, (len(paths) * (comm.rank + 1)) // comm.size
    mine = comm.collectively(lambda: [open_source(p, f) for p, f in paths[lo:hi]])
    return [src for part in comm.allgather_obj(mine) for src in part]


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
    """Return the parsed SPECs, the tokenizer they need and their python functions."""
    needs_column = opts.size in _TEXT_KINDS or (opts.difficulty or opts.size) in _TEXT_KINDS
    column = _resolve_column(opts, files) if needs_column else opts.column
    size_spec = parse_spec(opts.size, column, "--size")
    diff_spec = parse_spec(opts.difficulty, column, "--difficulty") if opts.difficulty else None
    tokenizer = None
    if "tokens" in (size_spec.kind, diff_spec.kind if diff_spec else None):
        tokenizer = load_tokenizer(opts.tokenizer, "--size" if size_spec.kind == "tokens" else "--difficulty")
    funcs = {s.text: load_function(s) for s in (size_spec, diff_spec) if s and s.kind == "python"}
    return Specs(size_spec, diff_spec, tokenizer, funcs)


def analyze(comm: Comm, inputs: list[str], opts: AnalyzeOptions, show_progress: bool = False,
            token_sink=None, piece_sink=None) -> SampleColumns:
    """Return this rank's slice of (sample_id, size, difficulty) for the inputs.

    ``token_sink(table, column, tokenizer, where)`` (``run --store-tokens``) replaces the
    ``--size tokens`` count: it returns the sizes and keeps the ids of the same encode.
    ``piece_sink(table, sizes, where)`` (``run --size bytes --oversize split``, ``split.ByteCuts``)
    sees each read's sizes with its table, in sample order, to cut the oversize texts it holds.

    Ranks take disjoint contiguous runs of units (row groups, record batches, whole
    files) balanced by rows (bytes where rows are unknown), so each rank's samples are a
    contiguous range of global ids.
    """
    files = _describe_all(comm, inputs, opts.input_format, opts.split)
    specs: Specs = comm.collectively(_parse_specs, opts, files)
    size_spec, diff_spec, tokenizer, funcs = specs.size, specs.difficulty, specs.tokenizer, specs.funcs

    # Units in global order; unit rows where metadata knows them.
    unit_file = np.concatenate([np.full(f.num_units, i, dtype=np.int64) for i, f in enumerate(files)])
    unit_local = np.concatenate([np.arange(f.num_units, dtype=np.int64) for f in files])
    known = np.concatenate([np.asarray(f.unit_rows if f.unit_rows is not None else [-1], dtype=np.int64)
                            for f in files])
    unit_bytes = np.concatenate([np.asarray(f.unit_bytes if f.unit_bytes is not None else [0] * f.num_units,
                                            dtype=np.int64) for f in files])
    unknown = known < 0
    weights = np.where(unknown, 0, known).astype(np.int64)
    if unknown.any():
        # Without row counts, weigh a file by the rows estimated from its head (jsonl, csv),
        # else its bytes as rows at the average bytes per known row.
        byte_w = np.asarray([files[i].bytes for i in unit_file[unknown]], dtype=np.float64)
        est = np.asarray([-1 if files[i].est_rows is None else files[i].est_rows for i in unit_file[unknown]],
                         dtype=np.float64)
        known_rows, known_bytes = int(weights.sum()), sum(f.bytes for f in files if f.unit_rows is not None)
        scale = known_rows / known_bytes if known_rows and known_bytes else 1.0
        guess = np.where(est >= 0, est, byte_w * scale)
        weights[unknown] = np.where(byte_w > 0, np.maximum(1, np.round(guess)), 0).astype(np.int64)
    # ranks take contiguous row ranges, cut inside a unit where its rows are known
    cut_unit, cut_off = split_rows(weights, ~unknown, comm.size)
    lo, hi = int(cut_unit[comm.rank]), int(cut_unit[comm.rank + 1])
    head, tail = int(cut_off[comm.rank]), int(cut_off[comm.rank + 1])
    row_pos = np.concatenate(([0], np.cumsum(weights)))

    # what pack --store checks later: each file's mtime and digest, taken before it is read
    first_unit = np.searchsorted(unit_file, np.arange(len(files)))
    owners = np.clip(np.searchsorted(cut_unit, first_unit, side="right") - 1, 0, comm.size - 1)
    digests = record(comm, [f.path for f in files], [f.format for f in files], [f.bytes for f in files], owners)

    columns = sorted({c for s in (size_spec, diff_spec) if s for c in (s.columns() or []) if c}) or None
    if any(s and s.kind == "python" for s in (size_spec, diff_spec)):
        columns = None
    text_columns = sorted({s.column for s in (size_spec, diff_spec) if s and s.kind in _TEXT_KINDS and s.column})

    counter = "tokens" if size_spec.kind == "tokens" else "summed size"  # the progress line's running sum

    def measure() -> Measured:
        """Return this rank's sizes and difficulties, read by read."""
        sizes: list[np.ndarray] = []
        diffs: list[np.ndarray] = []
        my_rows: list[int] = []
        reads = _rank_reads(unit_file, unit_local, known, lo, hi, head, tail, unit_bytes)
        mine = int(row_pos[hi] + tail - row_pos[lo] - head)
        prog = Progress("analyze", mine, "rows", show_progress and comm.is_root(), comm.size,
                        job_total=int(row_pos[-1]))
        for read in reads:
            src = files[read.file]
            if read.row_lo is None or read.row_hi is None:
                table = read_units(src, read.first, read.end, columns, text_columns)
                expect = sum(src.unit_rows[read.first:read.end]) if src.unit_rows is not None else None
            else:
                table = read_unit_rows(src, read.first, read.row_lo, read.row_hi, columns, text_columns)
                expect = read.row_hi - read.row_lo
            if src.unit_rows is None:
                my_rows.append(table.num_rows)
            elif expect != table.num_rows:
                raise SortpackError(f"{src.path}: read {table.num_rows} rows, metadata says {expect}")
            if table.num_rows == 0:
                # an empty file or row group: its columns may not even exist (empty jsonl)
                continue
            if token_sink is not None and size_spec.kind == "tokens":
                size = token_sink(table, size_spec.column, tokenizer, src.path)
            else:
                size = as_size(evaluate(size_spec, table, src.path, tokenizer, funcs.get(size_spec.text),
                                        opts.special_tokens),
                               src.path, f"--size {size_spec.text}")
            if piece_sink is not None:
                piece_sink(table, size, src.path)
            if diff_spec is None:
                diff = size
            else:
                diff = as_difficulty(evaluate(diff_spec, table, src.path, tokenizer, funcs.get(diff_spec.text),
                                              opts.special_tokens),
                                     src.path, f"--difficulty {diff_spec.text}")
            sizes.append(size)
            diffs.append(diff)
            prog.update(table.num_rows, None, **{counter: int(size.sum())})
        prog.close()
        return Measured(sizes, diffs, my_rows)

    measured: Measured = comm.collectively(measure)
    sizes, diffs, my_rows = measured.sizes, measured.diffs, measured.unknown_rows

    # Rows of whole-file units are known only now: share them, then number the samples.
    unit_rows = known.copy()
    # (unknown units are never cut, and each is read by exactly the rank whose run starts at it)
    mine = np.flatnonzero(unknown[lo:hi]) + lo
    found = comm.allgather_obj([(int(u), r) for u, r in zip(mine, my_rows)])
    for part in found:
        for u, r in part:
            unit_rows[u] = r
    start = int(unit_rows[:lo].sum()) + head
    total = int(unit_rows.sum())
    if total == 0:  # every rank sees the same total: all raise together
        names = ", ".join(inputs[:3]) + (f" and {len(inputs) - 3} more" if len(inputs) > 3 else "")
        raise SortpackError(f"{names}: the input holds no rows", collective=True)
    file_rows = np.bincount(unit_file, weights=unit_rows, minlength=len(files)).astype(np.int64)
    fingerprint = [{**f.fingerprint(r), **d} for f, r, d in zip(files, file_rows, digests)]

    size = np.concatenate(sizes) if sizes else np.empty(0, np.int64)
    diff_dtype = _common_dtype(comm, diffs)
    if diff_spec is None:
        diff = size  # the same array: later stages see it and move nothing twice
    else:
        diff = np.concatenate(diffs).astype(diff_dtype, copy=False) if diffs else np.empty(0, diff_dtype)
    sample_id = np.arange(start, start + len(size), dtype=np.int64)
    empty_size = empty_token_count(tokenizer) if size_spec.kind == "tokens" and opts.special_tokens else 0
    return SampleColumns(start, total, sample_id, size, diff, None, fingerprint, empty_size)


def empty_token_count(tokenizer) -> int:
    """Return the tokens an empty text measures with special tokens on (the post-processor's, e.g. 2).

    One encode of the empty string, once per job: a sample whose measured size is no more than
    this has no content (``stages.pack.filters.content_empty``), so no second encode per sample.
    """
    return len(tokenizer.encode("", add_special_tokens=True).ids)


def measured_options(opts: AnalyzeOptions, samples: SampleColumns) -> dict:
    """Return the options a metrics manifest records: ``opts`` plus what analyze decided (``empty_size``).

    ``empty_size`` is recorded only when it is not 0, so plans that count no special tokens
    keep their content hash.
    """
    out = opts.as_dict()
    if samples.empty_size:
        out["empty_size"] = samples.empty_size
    return out


def _rank_reads(unit_file: np.ndarray, unit_local: np.ndarray, unit_rows: np.ndarray, lo: int, hi: int,
                head: int, tail: int, unit_bytes: np.ndarray | None = None) -> list[Read]:
    """Return the reads of one rank's run, in global row order.

    The run starts at row ``head`` of unit ``lo`` and ends before row ``tail`` of unit
    ``hi`` (the end is unit ``hi`` itself when ``tail`` is 0). A unit read only in part has
    ``row_lo, row_hi`` set (and is the only unit of its read); whole units have None.
    """
    def part(u: int, a: int, b: int) -> Read:
        """Return the read of rows ``[a, b)`` of unit ``u``."""
        return Read(int(unit_file[u]), int(unit_local[u]), int(unit_local[u]) + 1, a, b)

    if lo == hi:
        return [part(lo, head, tail)] if tail > head else []
    reads: list[Read] = []
    first_whole = lo
    if head > 0:
        reads.append(part(lo, head, int(unit_rows[lo])))
        first_whole = lo + 1
    reads += _file_runs(unit_file[first_whole:hi], unit_local[first_whole:hi], unit_rows[first_whole:hi],
                        None if unit_bytes is None else unit_bytes[first_whole:hi])
    if tail > 0:
        reads.append(part(hi, 0, tail))
    return reads


def _common_dtype(comm: Comm, parts: list[np.ndarray]) -> np.dtype:
    """Return the difficulty dtype every rank uses: float64 if any rank measured floats, else int64."""
    # One rank may see only integer values where another sees floats; all must agree.
    is_float = any(p.dtype.kind == "f" for p in parts)
    return np.dtype(np.float64) if comm.allreduce(int(is_float), "max") else np.dtype(np.int64)


READ_ROWS = 1 << 20  # rows read at once: bounds memory on ranks with many row groups
# decoded bytes read at once: 1M rows of 1 KB text held together cost 2-4x the decode in
# fresh memory (analyze of 1M such rows: 2.1-4.0 s in reads of 1M rows, 0.9 s in 64k)
READ_BYTES = 64 << 20


def _file_runs(unit_file: np.ndarray, unit_local: np.ndarray, unit_rows: np.ndarray,
               unit_bytes: np.ndarray | None = None) -> list[Read]:
    """Return the reads of whole units covering a contiguous unit range.

    A read stays within one file and holds at most READ_ROWS rows and READ_BYTES decoded
    bytes (or one unit).
    """
    if len(unit_file) == 0:
        return []
    # a new read starts at every file change and whenever the running row count (or byte
    # count) of the current file's run crosses a multiple of READ_ROWS (READ_BYTES)
    file_change = np.concatenate(([True], unit_file[1:] != unit_file[:-1]))
    run_id = np.cumsum(file_change) - 1
    new = file_change.copy()
    for amount, limit in ((unit_rows, READ_ROWS), (unit_bytes, READ_BYTES)):
        if amount is None:
            continue
        amount = np.maximum(amount, 0)
        run_start = np.cumsum(amount) - amount
        base = run_start[np.flatnonzero(file_change)][run_id]
        bucket = (run_start - base) // limit
        new |= np.concatenate(([True], bucket[1:] != bucket[:-1]))
    starts = np.flatnonzero(new)
    ends = np.concatenate((starts[1:], [len(unit_file)]))
    return [Read(int(unit_file[a]), int(unit_local[a]), int(unit_local[b - 1]) + 1) for a, b in zip(starts, ends)]
