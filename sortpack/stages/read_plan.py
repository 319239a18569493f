"""Analyze's plan of reads: which units and rows of the inputs each rank reads, with no communication.

Every rank computes the same plan from the same file descriptions and takes its own part
(``plan_reads(files, rank=, size=)``): ranks take disjoint contiguous runs of units (row
groups, record batches, whole files) balanced by rows (``partition.split_rows``; bytes
where rows are unknown), so each rank's samples are a contiguous range of global ids.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..inputs.source_file import SourceFile
from ..partition import rank_run, split_rows, unit_owners

READ_ROWS = 1 << 20  # rows read at once: bounds memory on ranks with many row groups
# decoded bytes read at once: 1M rows of 1 KB text held together cost 2-4x the decode in
# fresh memory (analyze of 1M such rows: 2.1-4.0 s in reads of 1M rows, 0.9 s in 64k)
READ_BYTES = 64 << 20


class Read(NamedTuple):
    """One read of a rank's run: units ``[first, end)`` of file ``file``, or rows ``[row_lo, row_hi)`` of one unit."""

    file: int
    first: int
    end: int
    row_lo: int | None = None  # set (with row_hi) when the read takes part of a unit
    row_hi: int | None = None


class Units(NamedTuple):
    """Every input unit in global order: its file, its index in that file, its rows (-1: unknown), its bytes."""

    file: np.ndarray
    local: np.ndarray
    rows: np.ndarray
    bytes: np.ndarray

    @property
    def unknown(self) -> np.ndarray:
        """Return which units' rows are known only once they are parsed (whole jsonl / csv files)."""
        return self.rows < 0


class ReadPlan(NamedTuple):
    """One rank's part of the inputs: its run of units and rows, its reads, and which rank hashes each file.

    The run starts at row ``head`` of unit ``lo`` and ends before row ``tail`` of unit ``hi``.
    """

    units: Units
    weights: np.ndarray  # rows per unit, estimated where unknown
    lo: int
    head: int
    hi: int
    tail: int
    reads: list[Read]
    file_owners: np.ndarray  # a rank that reads each file's first unit (and hashes the file)

    @property
    def rows(self) -> int:
        """Return the rows this rank reads (estimated where the units' rows are unknown)."""
        pos = np.concatenate(([0], np.cumsum(self.weights)))
        return int(pos[self.hi] + self.tail - pos[self.lo] - self.head)

    @property
    def total_rows(self) -> int:
        """Return the rows of every rank together (estimated where unknown)."""
        return int(self.weights.sum())


def describe_units(files: list[SourceFile]) -> Units:
    """Return the units of ``files`` in global order, with their rows where the metadata knows them."""
    return Units(
        np.concatenate([np.full(f.num_units, i, dtype=np.int64) for i, f in enumerate(files)]),
        np.concatenate([np.arange(f.num_units, dtype=np.int64) for f in files]),
        np.concatenate([np.asarray(f.unit_rows if f.unit_rows is not None else [-1], dtype=np.int64)
                        for f in files]),
        np.concatenate([np.asarray(f.unit_bytes if f.unit_bytes is not None else [0] * f.num_units,
                                   dtype=np.int64) for f in files]))


def unit_weights(files: list[SourceFile], units: Units) -> np.ndarray:
    """Return every unit's rows where known, else its estimated rows: the weight ranks' shares balance."""
    unknown = units.unknown
    weights = np.where(unknown, 0, units.rows).astype(np.int64)
    if unknown.any():
        # Without row counts, weigh a file by the rows estimated from its head (jsonl, csv),
        # else its bytes as rows at the average bytes per known row.
        byte_w = np.asarray([files[i].bytes for i in units.file[unknown]], dtype=np.float64)
        est = np.asarray([-1 if files[i].est_rows is None else files[i].est_rows for i in units.file[unknown]],
                         dtype=np.float64)
        known_rows, known_bytes = int(weights.sum()), sum(f.bytes for f in files if f.unit_rows is not None)
        scale = known_rows / known_bytes if known_rows and known_bytes else 1.0
        guess = np.where(est >= 0, est, byte_w * scale)
        weights[unknown] = np.where(byte_w > 0, np.maximum(1, np.round(guess)), 0).astype(np.int64)
    return weights


def plan_reads(files: list[SourceFile], *, rank: int, size: int) -> ReadPlan:
    """Return rank ``rank`` of ``size``'s plan of reads of ``files`` (the same files on every rank)."""
    units = describe_units(files)
    weights = unit_weights(files, units)
    # ranks take contiguous row ranges, cut inside a unit where its rows are known
    cut_unit, cut_off = split_rows(weights, ~units.unknown, size)
    lo, head, hi, tail = rank_run(cut_unit, cut_off, rank=rank)
    owners = unit_owners(cut_unit, np.searchsorted(units.file, np.arange(len(files))), size=size)
    reads = rank_reads(units, lo, hi, head, tail)
    return ReadPlan(units, weights, lo, head, hi, tail, reads, owners)


def rank_reads(units: Units, lo: int, hi: int, head: int, tail: int) -> list[Read]:
    """Return the reads of one rank's run of ``units``, in global row order.

    The run starts at row ``head`` of unit ``lo`` and ends before row ``tail`` of unit
    ``hi`` (the end is unit ``hi`` itself when ``tail`` is 0). A unit read only in part has
    ``row_lo, row_hi`` set (and is the only unit of its read); whole units have None.
    """
    unit_file, unit_local, unit_rows, unit_bytes = units.file, units.local, units.rows, units.bytes

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
    reads += file_runs(unit_file[first_whole:hi], unit_local[first_whole:hi], unit_rows[first_whole:hi],
                       unit_bytes[first_whole:hi])
    if tail > 0:
        reads.append(part(hi, 0, tail))
    return reads


def file_runs(unit_file: np.ndarray, unit_local: np.ndarray, unit_rows: np.ndarray,
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
