"""SampleColumns: one rank's slice of the per-sample columns, the data every stage passes on.

Neutral ground between the stages: analyze makes it, sort reorders it, pack consumes it,
so sort and pack need not import analyze.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..parallel import Comm


@dataclass
class SampleColumns:
    """One rank's contiguous slice of per-sample arrays, with its place in the whole."""

    start: int  # global position of the first local row
    total: int  # rows over all ranks
    sample_id: np.ndarray
    size: np.ndarray
    difficulty: np.ndarray
    stage: np.ndarray | None = None
    files: list[dict] = field(default_factory=list)  # source fingerprint (every rank)
    # the size of a sample without content (``--size tokens`` with special tokens: the
    # [CLS][SEP] an empty text measures), what analyze decided; 0 for every other size kind
    empty_size: int = 0
    # ``--oversize split``: where each sample's range starts in its source sample (its end is
    # ``begin + size``); None when no sample was cut, so other plans carry no such column
    begin: np.ndarray | None = None
    # extra per-sample measures by name (int64, aligned with sample_id): ``size2``, ``targets``;
    # every stage moves them without knowing their names, and an empty dict adds no column anywhere
    measures: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        """Return the number of samples on this rank."""
        return len(self.sample_id)

    def columns(self) -> dict[str, np.ndarray]:
        """Return the per-sample arrays by column name (no ``difficulty`` when it is the size)."""
        cols = {"sample_id": self.sample_id, "size": self.size}
        if self.difficulty is not self.size:
            # the same array would otherwise be moved between ranks twice
            cols["difficulty"] = self.difficulty
        if self.stage is not None:
            cols["stage"] = self.stage
        if self.begin is not None:
            cols["begin"] = self.begin
        for name in sorted(self.measures):
            cols[name] = self.measures[name]
        return cols

    def clear(self) -> None:
        """Empty the columns in place (their memory goes once nothing else holds it); start, total, files stay."""
        empty = np.zeros(0, np.int64)
        self.sample_id = self.size = self.difficulty = empty
        self.stage = None
        self.begin = None
        self.measures = {}

    def stage_or_zero(self) -> np.ndarray:
        """Return the curriculum stage of each sample (int16, all 0 without stages)."""
        return self.stage if self.stage is not None else np.zeros(len(self), np.int16)

    def select(self, keep: np.ndarray, start: int, total: int) -> SampleColumns:
        """Return the samples where ``keep`` is true, placed at ``start`` of ``total`` (same files).

        A difficulty that is the size stays the very same array, so it is still moved once.
        """
        size = self.size[keep]
        difficulty = size if self.difficulty is self.size else self.difficulty[keep]
        stage = None if self.stage is None else self.stage[keep]
        begin = None if self.begin is None else self.begin[keep]
        return SampleColumns(start, total, self.sample_id[keep], size, difficulty, stage, self.files,
                             self.empty_size, begin, {k: v[keep] for k, v in self.measures.items()})

    @classmethod
    def from_columns(cls, start: int, total: int, cols: dict[str, np.ndarray], files: list[dict],
                     empty_size: int = 0) -> SampleColumns:
        """Return SampleColumns rebuilt from ``columns()`` output (difficulty defaults to the size)."""
        return cls(start, total, cols["sample_id"], cols["size"], cols.get("difficulty", cols["size"]),
                   cols.get("stage"), files, empty_size, cols.get("begin"), measures_of(cols))


# the columns of ``SampleColumns.columns()`` that are not measures
BASE_COLUMNS = frozenset(("sample_id", "size", "difficulty", "stage", "begin"))


def measures_of(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Return the measure columns among per-sample ``cols`` (every name that is not a base column), as int64."""
    return {k: np.asarray(v).astype(np.int64, copy=False) for k, v in cols.items() if k not in BASE_COLUMNS}


def exact_sum(values: np.ndarray) -> int:
    """Return the sum of an integer array as a Python int, exact where numpy's int64 sum would wrap.

    Sizes may come from a user's column (``column:NAME``) and reach 2^60; a sum of 32-bit
    halves cannot wrap for fewer than 2^31 values per call.
    """
    v = np.asarray(values)
    if v.size == 0:
        return 0
    v = v.astype(np.int64, copy=False)
    high = int((v >> 32).sum(dtype=np.int64))
    low = int((v & 0xFFFFFFFF).astype(np.uint64).sum(dtype=np.uint64))
    return (high << 32) + low


def sample_stats(comm: Comm, s: SampleColumns) -> dict:
    """Return the manifest's ``stats`` of the samples over all ranks (count, size and difficulty range)."""
    n = len(s)
    size_sum = comm.allreduce(exact_sum(s.size), "sum")  # Python ints: the sum over ranks is exact too
    smin = comm.allreduce(int(s.size.min()) if n else 2**62, "min")
    smax = comm.allreduce(int(s.size.max()) if n else -1, "max")
    dmin = comm.allreduce(float(s.difficulty.min()) if n else float("inf"), "min")
    dmax = comm.allreduce(float(s.difficulty.max()) if n else float("-inf"), "max")
    stats = {"num_samples": s.total, "size_sum": size_sum, "size_min": smin, "size_max": smax,
             "difficulty_min": dmin, "difficulty_max": dmax}
    for name in sorted(s.measures):  # totals of the measures, present only when measured
        stats[name] = comm.allreduce(exact_sum(s.measures[name]), "sum")
    if s.stage is not None:
        counts = np.bincount(s.stage.astype(np.int64), minlength=1) if n else np.zeros(1, np.int64)
        width = comm.allreduce(len(counts), "max")
        counts = comm.allreduce(np.pad(counts, (0, width - len(counts))).astype(np.int64), "sum")
        stats["stage_counts"] = [int(c) for c in counts]
    return stats


MEASURE_PREFIX = "measure:"  # a measure's column among others while it travels: its name cannot meet theirs


def with_measures(columns: dict[str, np.ndarray], measures: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Return ``columns`` with each measure added under its travelling name (``MEASURE_PREFIX`` + name)."""
    return {**columns, **{MEASURE_PREFIX + k: v for k, v in measures.items()}}


def measures_in(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Return the measures among ``columns`` (those ``with_measures`` added), by their own names."""
    return {k[len(MEASURE_PREFIX):]: v for k, v in columns.items() if k.startswith(MEASURE_PREFIX)}
