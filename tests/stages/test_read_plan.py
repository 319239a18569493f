"""Analyze's plan of reads (sortpack.stages.read_plan): which rank reads which units and rows, without MPI."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sortpack.inputs.source_file import SourceFile
from sortpack.stages import read_plan
from sortpack.stages.read_plan import describe_units, file_runs, plan_reads, unit_weights


def runs(*args):
    return [(r.file, r.first, r.end) for r in file_runs(*args)]


def test_file_runs_split_at_files_and_row_limit(monkeypatch):
    monkeypatch.setattr(read_plan, "READ_ROWS", 5)
    unit_file = np.array([0, 0, 0, 0, 1, 2, 2])
    unit_local = np.array([0, 1, 2, 3, 0, 3, 4])
    rows = np.array([3, 3, 3, 3, -1, 10, 1])
    assert runs(unit_file, unit_local, rows) == [(0, 0, 2), (0, 2, 4), (1, 0, 1), (2, 3, 4), (2, 4, 5)]
    assert runs(unit_file[:0], unit_local[:0], rows[:0]) == []


def test_file_runs_also_split_at_the_byte_limit(monkeypatch):
    # few rows of large values: the byte bound cuts where the row bound would not
    monkeypatch.setattr(read_plan, "READ_ROWS", 100)
    monkeypatch.setattr(read_plan, "READ_BYTES", 1000)
    unit_file = np.array([0, 0, 0, 0, 0])
    unit_local = np.arange(5)
    rows = np.array([3, 3, 3, 3, 3])
    nbytes = np.array([400, 400, 400, 1500, 10])
    assert runs(unit_file, unit_local, rows, nbytes) == [(0, 0, 3), (0, 3, 4), (0, 4, 5)]
    assert runs(unit_file, unit_local, rows) == [(0, 0, 5)]


def parquet(name, rows):
    return SourceFile(name, "parquet", 100 * sum(rows), list(rows), [100 * r for r in rows])


def jsonl(name, nbytes, est=None):
    return SourceFile(name, "jsonl", nbytes, None, None, est)


def test_unknown_files_weigh_by_their_estimate_else_their_bytes_at_the_known_rate():
    files = [parquet("a", [10, 30]), jsonl("b", 2000, est=7), jsonl("c", 1000), jsonl("d", 0)]
    units = describe_units(files)
    assert units.file.tolist() == [0, 0, 1, 2, 3] and units.local.tolist() == [0, 1, 0, 0, 0]
    assert units.rows.tolist() == [10, 30, -1, -1, -1]
    # 40 rows in 4000 bytes: c's 1000 bytes weigh 10 rows; an empty file weighs nothing
    assert unit_weights(files, units).tolist() == [10, 30, 7, 10, 0]


def rows_read(files, read):
    """Return the (file, unit, row) of every row ``read`` takes (a unit of unknown rows: one marker row)."""
    src = files[read.file]
    if read.row_lo is not None:
        return [(read.file, read.first, r) for r in range(read.row_lo, read.row_hi)]
    return [(read.file, u, r) for u in range(read.first, read.end)
            for r in (range(src.unit_rows[u]) if src.unit_rows is not None else [-1])]


def every_row(files):
    return [(i, u, r) for i, f in enumerate(files) for u in range(f.num_units)
            for r in (range(f.unit_rows[u]) if f.unit_rows is not None else [-1])]


def test_one_row_group_is_cut_exactly_between_ranks():
    files = [parquet("a", [10])]
    plans = [plan_reads(files, rank=r, size=3) for r in range(3)]
    assert [(p.lo, p.head, p.hi, p.tail) for p in plans] == [(0, 0, 0, 3), (0, 3, 0, 6), (0, 6, 1, 0)]
    assert [p.rows for p in plans] == [3, 3, 4] and plans[0].total_rows == 10
    assert [[(x.row_lo, x.row_hi) for x in p.reads] for p in plans] == [[(0, 3)], [(3, 6)], [(6, 10)]]
    assert plans[0].file_owners.tolist() == [2]  # the last rank whose run starts in the file's first unit


file_lists = st.lists(
    st.one_of(st.lists(st.integers(0, 40), min_size=1, max_size=4).map(lambda r: ("parquet", r)),
              st.tuples(st.integers(0, 5000), st.one_of(st.none(), st.integers(0, 50))).map(lambda t: ("jsonl", t))),
    min_size=1, max_size=6)


@given(file_lists, st.integers(1, 7), st.integers(1, 25))
def test_ranks_read_every_row_once_in_global_order(specs, size, read_rows):
    files = [parquet(f"f{i}", v) if kind == "parquet" else jsonl(f"f{i}", *v) for i, (kind, v) in enumerate(specs)]
    read_plan.READ_ROWS, saved = read_rows, read_plan.READ_ROWS
    try:
        plans = [plan_reads(files, rank=r, size=size) for r in range(size)]
    finally:
        read_plan.READ_ROWS = saved
    got = [row for p in plans for read in p.reads for row in rows_read(files, read)]
    assert got == every_row(files)
    assert sum(p.rows for p in plans) == plans[0].total_rows
    for p in plans:  # a read of part of a unit takes that unit alone
        assert all(read.row_lo is None or read.end - read.first == 1 for read in p.reads)
    # a file is hashed by a rank that reads its first unit, the same on every rank
    for p in plans:
        assert np.array_equal(p.file_owners, plans[0].file_owners)
    for i, owner in enumerate(plans[0].file_owners.tolist()):
        first_unit = {row[:2] for read in plans[owner].reads for row in rows_read(files, read)}
        assert (i, 0) in first_unit or not any(row[:2] == (i, 0) for row in every_row(files))
