"""The measurements ``run`` keeps for a failure after analyze: dumped raw, made a metrics directory only on failure.

A run that succeeds pays for one sequential write of each rank's own columns (numpy ``.npy``
files in the kept directory's temporary: no exchange between ranks, no Arrow, no hashing)
and their removal, a few percent of the run. Only a failure turns the dump into
``OUTPUT.metrics`` (Arrow shards, hashes, manifest): every rank together when the error is
collective, else the failing rank alone from every rank's files (they were all written
before the sort began), so a crash on one rank keeps them too.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SortpackError
from ..parallel import Comm, SerialComm
from ..stages.plan_options import PlanOptions
from ..stages.samples import SampleColumns
from .output import OutputDir
from .plan_record import PlanRecord
from .provenance import JobInfo, Profile

DUMP = "dump"  # inside the kept directory's temporary; removed before it is committed
_KEEPER = ".keeper"  # made by the one rank that assembles the dump alone
_CHUNK = 1 << 24  # rows copied at a time when one rank assembles every rank's files


@dataclass
class Dumped:
    """Where each rank's columns lie and what the metrics manifest needs besides them."""

    directory: Path
    # per rank: first global row, rows, {column: (dtype on disk, dtype in memory)}; a sample_id
    # numbered from the rank's first row is not on disk (dtype None)
    parts: list[tuple[int, int, dict[str, tuple[str | None, str]]]]
    total: int
    files: list[dict]
    empty_size: int
    options: PlanOptions

    def path(self, rank: int, name: str) -> Path:
        """Return the file holding ``rank``'s column ``name``."""
        return self.directory / f"r{rank:05d}-{name}.npy"

    def load(self, rank: int, name: str, as_written: bool = False) -> np.ndarray:
        """Return ``rank``'s column ``name`` as it was in memory (``as_written``: memory-mapped, as on disk)."""
        start, rows, cols = self.parts[rank]
        disk, mem = cols[name]
        if disk is None:
            return np.arange(start, start + rows, dtype=mem)
        arr = np.load(self.path(rank, name), mmap_mode="r", allow_pickle=False)
        return arr if disk == mem or as_written else arr.astype(mem)


def _narrow(arr: np.ndarray) -> np.dtype:
    """Return the dtype ``arr`` is written in: the smallest of int16 and int32 that holds an int64 column's values.

    Token counts below 32,768 take two bytes a sample instead of eight: the dump is a quarter
    of the bytes for the price of a min, a max and a cast per chunk.
    """
    if arr.dtype != np.int64 or not len(arr):
        return arr.dtype
    lo, hi = int(arr.min()), int(arr.max())
    for small in (np.int16, np.int32):
        info = np.iinfo(small)
        if info.min <= lo and hi <= info.max:
            return np.dtype(small)
    return arr.dtype


def _write(path: Path, arr: np.ndarray, dtype: np.dtype) -> None:
    """Write ``arr`` as a ``.npy`` file of ``dtype``, converted a chunk at a time (no full-size copy)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": (len(arr),)})
        if dtype == arr.dtype:
            f.write(np.ascontiguousarray(arr).data)
            return
        buf = np.empty(min(_CHUNK, len(arr)), dtype)
        for a in range(0, len(arr), _CHUNK):
            part = buf[:min(_CHUNK, len(arr) - a)]
            np.copyto(part, arr[a:a + len(part)], casting="unsafe")
            f.write(part.data)


def dump_samples(comm: Comm, out: OutputDir, samples: SampleColumns, options: PlanOptions,
                 ids_from_start: bool = False) -> Dumped | None:
    """Write this rank's columns into ``out``'s temporary (collective); return where (None: a write failed).

    ``ids_from_start``: the caller vouches that the sample ids are ``start, start + 1, ...``
    (analyze's numbering), so they are not written. A failing write (a full disk) drops the
    dump on every rank and the job goes on: it is insurance, not output.
    """
    directory = out.ensure() / DUMP
    cols = samples.columns()
    kept: dict[str, tuple[str | None, str]] = {}
    ok = True
    try:
        directory.mkdir(exist_ok=True)
        for name, arr in cols.items():
            if name == "sample_id" and ids_from_start:
                kept[name] = (None, arr.dtype.str)
                continue
            disk = _narrow(arr)
            _write(directory / f"r{comm.rank:05d}-{name}.npy", arr, disk)
            kept[name] = (disk.str, arr.dtype.str)
    except OSError:
        ok = False
    parts = comm.allgather_obj((samples.start, len(samples), kept if ok else None))
    if any(p[2] is None for p in parts):
        out.discard()
        return None
    return Dumped(directory, [(int(a), int(n), dict(c)) for a, n, c in parts], samples.total,
                  samples.files, samples.empty_size, options)


def keep_together(comm: Comm, out: OutputDir, dumped: Dumped, prof: Profile, job: JobInfo) -> dict | None:
    """Write the metrics shards from every rank's own dump (collective); return the manifest (None: failed).

    For an error raised on every rank together: each rank writes its share, as analyze's
    write would have; the caller commits the manifest from one rank.
    """
    from .sample_dirs import write_sample_shards  # loaded by a failure only: a job that succeeds writes none

    start, _, names = dumped.parts[comm.rank]
    cols = {name: dumped.load(comm.rank, name) for name in names}
    samples = SampleColumns.from_columns(start, dumped.total, cols, dumped.files, dumped.empty_size)
    try:
        record = PlanRecord(dumped.options, samples.files, prof, job)
        manifest = write_sample_shards(comm, out, "metrics", samples, record)
    except SortpackError:  # raised together (a full disk): nothing is kept, the job's own error stands
        manifest = None
    del samples, cols
    if comm.is_root():
        shutil.rmtree(dumped.directory, ignore_errors=True)
    return manifest


def keep_alone(out: OutputDir, dumped: Dumped, job: JobInfo) -> dict | None:
    """Write the metrics shards from every rank's dump on this rank alone; return the manifest (None: not kept).

    For an error on this rank only: the others may be blocked in a collective or aborted.
    The columns are assembled into one memory-mapped file each (the ranks' files in rank
    order are the samples in order), then written as a one-rank job would (the same bytes).
    When several ranks fail at once, the first to claim the dump writes it; the others wait
    for it (a bounded wait), so that their abort does not cut it short.
    """
    from .sample_dirs import write_sample_shards  # loaded by a failure only: a job that succeeds writes none

    keeper = out.tmp / _KEEPER
    try:
        keeper.mkdir()
    except FileExistsError:
        _wait_for(keeper, out.tmp)
        return None
    except OSError:
        return None
    try:
        cols = {name: _assemble(dumped, name, keeper) for name in dict.fromkeys(
            n for _, _, names in dumped.parts for n in names)}
        samples = SampleColumns.from_columns(0, dumped.total, cols, dumped.files, dumped.empty_size)
        one = SerialComm()  # the job's profile reduces over every rank: a fresh one of this rank alone
        record = PlanRecord(dumped.options, samples.files, Profile(one), job)
        manifest = write_sample_shards(one, out, "metrics", samples, record)
        del samples, cols
        shutil.rmtree(dumped.directory, ignore_errors=True)
        return manifest
    except (SortpackError, OSError):
        return None
    finally:
        shutil.rmtree(keeper, ignore_errors=True)


def _assemble(dumped: Dumped, name: str, into: Path) -> np.ndarray:
    """Return column ``name`` of every rank in order, one memory-mapped array (a rank without it: its default)."""
    have = [r for r, (_, rows, cols) in enumerate(dumped.parts) if name in cols]
    dtype = np.result_type(*[dumped.parts[r][2][name][1] for r in have if dumped.parts[r][1]] or
                           [dumped.parts[have[0]][2][name][1]])
    whole = np.lib.format.open_memmap(into / f"{name}.npy", mode="w+", dtype=dtype, shape=(dumped.total,))
    for r, (start, rows, cols) in enumerate(dumped.parts):
        # a difficulty that is the size is not dumped; any other column a rank lacks is zero there
        # (``begin``: no sample of that rank was cut)
        src = name if name in cols else "size" if name == "difficulty" else None
        part = dumped.load(r, src, as_written=True) if src is not None else None
        for a in range(0, rows, _CHUNK):
            b = min(a + _CHUNK, rows)
            whole[start + a:start + b] = part[a:b] if part is not None else 0
    whole.flush()
    del whole
    return np.load(into / f"{name}.npy", mmap_mode="r", allow_pickle=False)


def _wait_for(keeper: Path, tmp: Path, claimed_s: float = 600.0, moving_s: float = 10.0) -> None:
    """Wait (bounded) until the rank that claimed the dump has written it and moved it into place."""
    deadline = time.monotonic() + claimed_s
    while keeper.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + moving_s
    while tmp.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
