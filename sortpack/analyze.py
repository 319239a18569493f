"""Stage 1: read the inputs in parallel and measure every sample's size and difficulty."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import SortpackError
from .parallel import Comm
from .progress import progress
from .sources import SourceFile, describe, expand_inputs, file_columns, read_unit_rows, read_units, split_rows
from .specs import Spec, as_difficulty, as_size, evaluate, load_function, load_tokenizer, parse_spec


_TEXT_KINDS = ("length", "bytes", "words", "tokens")


@dataclass
class AnalyzeOptions:
    """What to measure: the column and the size/difficulty SPECs."""

    column: str | None = None
    size: str = "length"
    difficulty: str | None = None
    tokenizer: str | None = None
    input_format: str = "auto"

    def as_dict(self) -> dict:
        """Return the options as recorded in manifests (tokenizer by file name only)."""
        return {"column": self.column, "size": self.size, "difficulty": self.difficulty or self.size,
                "tokenizer": None if not self.tokenizer else str(self.tokenizer).rsplit("/", 1)[-1],
                "input_format": self.input_format}


@dataclass
class Samples:
    """One rank's contiguous slice of per-sample arrays, with its place in the whole."""

    start: int  # global position of the first local row
    total: int  # rows over all ranks
    sample_id: np.ndarray
    size: np.ndarray
    difficulty: np.ndarray
    stage: np.ndarray | None = None
    files: list[dict] = field(default_factory=list)  # source fingerprint (every rank)

    def __len__(self) -> int:
        return len(self.sample_id)

    def columns(self) -> dict[str, np.ndarray]:
        """Return the per-sample arrays by column name (no ``difficulty`` when it is the size)."""
        cols = {"sample_id": self.sample_id, "size": self.size}
        if self.difficulty is not self.size:
            # the same array would otherwise be moved between ranks twice
            cols["difficulty"] = self.difficulty
        if self.stage is not None:
            cols["stage"] = self.stage
        return cols

    @classmethod
    def from_columns(cls, start: int, total: int, cols: dict[str, np.ndarray], files: list[dict]) -> "Samples":
        """Return Samples rebuilt from ``columns()`` output (difficulty defaults to the size)."""
        return cls(start, total, cols["sample_id"], cols["size"], cols.get("difficulty", cols["size"]),
                   cols.get("stage"), files)


def _describe_all(comm: Comm, inputs: list[str], input_format: str) -> list[SourceFile]:
    err, paths = None, None
    if comm.is_root():
        try:
            paths = expand_inputs(inputs, input_format)
        except SortpackError as exc:
            err = exc
    comm.check(err)
    paths = comm.bcast_obj(paths)
    # Metadata reads are spread over ranks: a cluster job may name thousands of files, and
    # each rank opens only its contiguous slice of them; the small descriptions (row counts
    # per row group) are then shared with one allgather.
    lo, hi = (len(paths) * comm.rank) // comm.size, (len(paths) * (comm.rank + 1)) // comm.size
    mine, err = [], None
    try:
        mine = [describe(p, f) for p, f in paths[lo:hi]]
    except SortpackError as exc:
        err = exc
    comm.check(err)
    return [src for part in comm.allgather_obj(mine) for src in part]


def _resolve_column(opts: AnalyzeOptions, files: list[SourceFile]) -> str | None:
    if opts.column:
        return opts.column
    # an empty jsonl/csv shard has no columns to choose from: look at the next file
    names = next((n for n in map(file_columns, files) if n), [])
    if len(names) == 1:
        return names[0]
    if "text" in names:
        return "text"
    return None


def analyze(comm: Comm, inputs: list[str], opts: AnalyzeOptions, show_progress: bool = False) -> Samples:
    """Return this rank's slice of (sample_id, size, difficulty) for the inputs.

    Ranks take disjoint contiguous runs of units (row groups, record batches, whole
    files) balanced by rows (bytes where rows are unknown), so each rank's samples are a
    contiguous range of global ids.
    """
    files = _describe_all(comm, inputs, opts.input_format)
    err = None
    try:
        needs_column = opts.size in _TEXT_KINDS or (opts.difficulty or opts.size) in _TEXT_KINDS
        column = _resolve_column(opts, files) if needs_column else opts.column
        size_spec = parse_spec(opts.size, column, "--size")
        diff_spec = parse_spec(opts.difficulty, column, "--difficulty") if opts.difficulty else None
        tokenizer = None
        if "tokens" in (size_spec.kind, diff_spec.kind if diff_spec else None):
            tokenizer = load_tokenizer(opts.tokenizer, "--size" if size_spec.kind == "tokens" else "--difficulty")
        funcs = {s.text: load_function(s) for s in (size_spec, diff_spec) if s and s.kind == "python"}
    except SortpackError as exc:
        err = exc
    comm.check(err)

    # Units in global order; unit rows where metadata knows them.
    unit_file = np.concatenate([np.full(f.num_units, i, dtype=np.int64) for i, f in enumerate(files)])
    unit_local = np.concatenate([np.arange(f.num_units, dtype=np.int64) for f in files])
    known = np.concatenate([np.asarray(f.unit_rows if f.unit_rows is not None else [-1], dtype=np.int64)
                            for f in files])
    unknown = known < 0
    weights = np.where(unknown, 0, known).astype(np.int64)
    if unknown.any():
        # Without row counts, weigh a file's bytes as rows at the average bytes per known row.
        byte_w = np.asarray([files[i].bytes for i in unit_file[unknown]], dtype=np.float64)
        known_rows, known_bytes = int(weights.sum()), sum(f.bytes for f in files if f.unit_rows is not None)
        scale = known_rows / known_bytes if known_rows and known_bytes else 1.0
        weights[unknown] = np.where(byte_w > 0, np.maximum(1, np.round(byte_w * scale)), 0).astype(np.int64)
    cut_unit, cut_off = split_rows(weights, ~unknown, comm.size)
    lo, hi = int(cut_unit[comm.rank]), int(cut_unit[comm.rank + 1])
    head, tail = int(cut_off[comm.rank]), int(cut_off[comm.rank + 1])

    columns = sorted({c for s in (size_spec, diff_spec) if s for c in (s.columns() or [])}) or None
    if any(s and s.kind == "python" for s in (size_spec, diff_spec)):
        columns = None
    text_columns = sorted({s.column for s in (size_spec, diff_spec) if s and s.kind in _TEXT_KINDS})
    sizes, diffs, my_rows, err = [], [], [], None
    try:
        reads = _rank_reads(unit_file, unit_local, known, lo, hi, head, tail)
        for fidx, first, last, row_lo, row_hi in progress(reads, show_progress and comm.is_root(),
                                                          desc="analyze", unit="part"):
            src = files[fidx]
            if row_lo is None:
                table = read_units(src, first, last, columns, text_columns)
                expect = sum(src.unit_rows[first:last]) if src.unit_rows is not None else None
            else:
                table = read_unit_rows(src, first, row_lo, row_hi, columns, text_columns)
                expect = row_hi - row_lo
            if src.unit_rows is None:
                my_rows.append(table.num_rows)
            elif expect != table.num_rows:
                raise SortpackError(f"{src.path}: read {table.num_rows} rows, metadata says {expect}")
            if table.num_rows == 0:
                # an empty file or row group: its columns may not even exist (empty jsonl)
                continue
            size = as_size(evaluate(size_spec, table, src.path, tokenizer, funcs.get(size_spec.text)),
                           src.path, f"--size {size_spec.text}")
            if diff_spec is None:
                diff = size
            else:
                diff = as_difficulty(evaluate(diff_spec, table, src.path, tokenizer, funcs.get(diff_spec.text)),
                                     src.path, f"--difficulty {diff_spec.text}")
            sizes.append(size)
            diffs.append(diff)
    except SortpackError as exc:
        err = exc
    comm.check(err)

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
    err = None
    if total == 0:
        names = ", ".join(inputs[:3]) + (f" and {len(inputs) - 3} more" if len(inputs) > 3 else "")
        err = SortpackError(f"{names}: the input holds no rows")
    comm.check(err)
    file_rows = np.bincount(unit_file, weights=unit_rows, minlength=len(files)).astype(np.int64)
    fingerprint = [f.fingerprint(r) for f, r in zip(files, file_rows)]

    size = np.concatenate(sizes) if sizes else np.empty(0, np.int64)
    diff_dtype = _common_dtype(comm, diffs)
    if diff_spec is None:
        diff = size  # the same array: later stages see it and move nothing twice
    else:
        diff = np.concatenate(diffs).astype(diff_dtype, copy=False) if diffs else np.empty(0, diff_dtype)
    sample_id = np.arange(start, start + len(size), dtype=np.int64)
    return Samples(start, total, sample_id, size, diff, None, fingerprint)


def _common_dtype(comm: Comm, parts: list[np.ndarray]) -> np.dtype:
    # One rank may see only integer values where another sees floats; all must agree.
    is_float = any(p.dtype.kind == "f" for p in parts)
    return np.dtype(np.float64) if comm.allreduce(int(is_float), "max") else np.dtype(np.int64)


READ_ROWS = 1 << 20  # rows read at once: bounds memory on ranks with many row groups


def _rank_reads(unit_file: np.ndarray, unit_local: np.ndarray, unit_rows: np.ndarray, lo: int, hi: int,
                head: int, tail: int) -> list[tuple[int, int, int, int | None, int | None]]:
    """Return the reads of one rank's run, in global row order: (file, first unit, end unit, row_lo, row_hi).

    The run starts at row ``head`` of unit ``lo`` and ends before row ``tail`` of unit
    ``hi`` (the end is unit ``hi`` itself when ``tail`` is 0). A unit read only in part has
    ``row_lo, row_hi`` set (and is the only unit of its read); whole units have None.
    """
    def part(u: int, a: int, b: int) -> tuple[int, int, int, int, int]:
        return int(unit_file[u]), int(unit_local[u]), int(unit_local[u]) + 1, a, b

    if lo == hi:
        return [part(lo, head, tail)] if tail > head else []
    reads: list = []
    first_whole = lo
    if head > 0:
        reads.append(part(lo, head, int(unit_rows[lo])))
        first_whole = lo + 1
    reads += [(f, a, b, None, None) for f, a, b in
              _file_runs(unit_file[first_whole:hi], unit_local[first_whole:hi], unit_rows[first_whole:hi])]
    if tail > 0:
        reads.append(part(hi, 0, tail))
    return reads


def _file_runs(unit_file: np.ndarray, unit_local: np.ndarray, unit_rows: np.ndarray) -> list[tuple[int, int, int]]:
    """Return (file, first unit, end unit) reads covering a contiguous unit range.

    A read stays within one file and holds at most READ_ROWS rows (or one unit).
    """
    if len(unit_file) == 0:
        return []
    rows = np.maximum(unit_rows, 0)
    # a new read starts at every file change and whenever the running row count of the
    # current file's run crosses a multiple of READ_ROWS
    file_change = np.concatenate(([True], unit_file[1:] != unit_file[:-1]))
    run_id = np.cumsum(file_change) - 1
    run_start_rows = np.cumsum(rows) - rows
    base = run_start_rows[np.flatnonzero(file_change)][run_id]
    bucket = (run_start_rows - base) // READ_ROWS
    new = file_change | np.concatenate(([True], bucket[1:] != bucket[:-1]))
    starts = np.flatnonzero(new)
    ends = np.concatenate((starts[1:], [len(unit_file)]))
    return [(int(unit_file[a]), int(unit_local[a]), int(unit_local[b - 1]) + 1) for a, b in zip(starts, ends)]
