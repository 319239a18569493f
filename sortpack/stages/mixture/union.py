"""The union of a mixture's sources: analyzed as one set of samples, numbered for one sort, cut and held out.

Sources that read one column are analyzed as one input (``source_bases``, ``source_of``);
sources analyzed apart are numbered contiguously per rank for the sort (``union_sources``),
with a segment table that maps the contiguous numbers back to global sample ids after it
(``global_ids``). ``analyze_union`` does either and returns the ``Union``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ...errors import SortpackError
from ...inputs.mixture import Mixture
from ...parallel import Comm
from ..analyze import AnalyzeOptions, Keepers, TokenKeeper, analyze
from ..holdout import DEFAULT_SEED, Holdout
from ..plan_options import PlanOptions
from ..samples import SampleColumns
from ..split import ByteCuts, split_oversize

__all__ = ["ReadWith", "SourceTokens", "Sources", "Union", "analyze_union", "global_ids", "holdout_plan",
           "own_column", "piece_sources", "segment_table", "source_bases", "source_of", "split_union",
           "union_measures", "union_segments", "union_sources"]


@dataclass(frozen=True)
class Sources:
    """Where each source's samples and files are in the union (the same on every rank)."""

    bases: np.ndarray  # each source's first global sample id, plus the end
    files: list[dict]  # every source's files, in order
    file_counts: list[int]  # files per source
    table: np.ndarray | None = None  # sources analyzed apart: the segment table (``global_ids``), else None


@dataclass
class Union:
    """This rank's part of the sources' union: its samples, each one's source, and the sources' layout."""

    samples: SampleColumns
    groups: np.ndarray  # each sample's source: the top field of the sort key
    sources: Sources
    cuts: ByteCuts | None = None  # --size bytes --oversize split: the cuts analyze placed while it read


class SourceTokens(TokenKeeper, Protocol):
    """A ``TokenKeeper`` told which global rows its ids are when the sources are analyzed apart."""

    def set_runs(self, runs: list[tuple[int, int]]) -> None:
        """Say which global rows this rank's ids are, as (first row, rows) runs in the order kept."""
        ...


@dataclass(frozen=True)
class ReadWith:
    """What analyze does beside measuring while it reads the sources: progress shown, token ids and byte cuts kept."""

    progress: bool = False
    tokens: SourceTokens | None = None  # --store-tokens: the ids --size tokens counts, kept for the store
    cuts: ByteCuts | None = None  # --size bytes --oversize split: where the oversize texts are cut


def source_bases(file_rows: np.ndarray, file_counts: list[int], names: list[str]) -> np.ndarray:
    """Return each source's first global sample id plus the end, from its files' rows (one-line error: an empty source).

    The sources' files are in order: ``file_counts[k]`` of ``file_rows`` are source k's.
    """
    file_first = np.concatenate(([0], np.cumsum(file_counts))).astype(np.int64)
    file_rows = np.asarray(file_rows, dtype=np.int64)
    rows = np.array([file_rows[file_first[k]:file_first[k + 1]].sum() for k in range(len(file_counts))], np.int64)
    empty = np.flatnonzero(rows == 0)
    if len(empty):
        raise SortpackError(f"mixture source {names[int(empty[0])]!r}: its inputs hold no rows", collective=True)
    return np.concatenate(([0], np.cumsum(rows)))


def source_of(samples: SampleColumns, bases: np.ndarray) -> np.ndarray:
    """Return the source of each of this rank's contiguous samples (int16)."""
    n = len(samples)
    cuts = np.clip(bases - samples.start, 0, n)
    return np.repeat(np.arange(len(bases) - 1, dtype=np.int16), np.diff(cuts))


def union_segments(starts: list[int], counts: list[int], bases: np.ndarray, vstart: int) -> list[tuple[int, int, int]]:
    """Return this rank's segments (contiguous start, global id start, count) of its sources' runs.

    Source k's run holds ``counts[k]`` samples from its own position ``starts[k]``; this rank
    numbers its runs contiguously from ``vstart``. Empty runs have no segment.
    """
    local = np.concatenate(([0], np.cumsum(counts)))[:-1] + vstart
    return [(int(local[k]), int(bases[k] + starts[k]), int(counts[k])) for k in range(len(counts)) if counts[k]]


def segment_table(segments: list[list[tuple[int, int, int]]]) -> np.ndarray:
    """Return every rank's segments as one table sorted by contiguous start (one empty row when there are none)."""
    table = np.array([s for part in segments for s in part] or [(0, 0, 0)], dtype=np.int64)
    return table[np.argsort(table[:, 0], kind="stable")]


def union_sources(comm: Comm, parts: list[SampleColumns]
                  ) -> tuple[SampleColumns, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
    """Return (the union numbered contiguously per rank, its groups, the segment table, source bases, files).

    The segment table (rows: contiguous start, global id start, count) maps the contiguous
    numbering back to global ids (``global_ids``); ``bases[k]`` is source k's first global id.
    """
    rows = np.array([p.total for p in parts], dtype=np.int64)
    bases = np.concatenate(([0], np.cumsum(rows)))
    n = [len(p) for p in parts]
    mine = int(sum(n))
    vstart = comm.exscan(mine)
    segs = union_segments([p.start for p in parts], n, bases, vstart)
    table = segment_table(comm.allgather_obj(segs))
    size = np.concatenate([p.size for p in parts]) if parts else np.zeros(0, np.int64)
    difficulty = _union_difficulty(comm, parts, size)
    groups = np.repeat(np.arange(len(parts), dtype=np.int64), n)
    files = [f for p in parts for f in p.files]
    total = int(rows.sum())
    union = SampleColumns(vstart, total, np.arange(vstart, vstart + mine, dtype=np.int64), size, difficulty, None,
                          files, max((p.empty_size for p in parts), default=0), measures=union_measures(comm, parts))
    return union, groups, table, bases, files


def _union_difficulty(comm: Comm, parts: list[SampleColumns], size: np.ndarray) -> np.ndarray:
    """Return the sources' difficulties concatenated: ``size`` itself where every source's is its size (collective).

    Float where any rank's source has a float difficulty, so every rank writes one type.
    """
    if comm.allreduce(int(all(p.difficulty is p.size for p in parts)), "min"):
        return size
    is_float = comm.allreduce(int(any(p.difficulty.dtype.kind == "f" for p in parts)), "max")
    dtype = np.float64 if is_float else np.int64
    return np.concatenate([p.difficulty.astype(dtype, copy=False) for p in parts])


def union_measures(comm: Comm, parts: list[SampleColumns]) -> dict[str, np.ndarray]:
    """Return the sources' measures concatenated in source order (every source must measure the same ones)."""
    names = sorted({k for p in parts for k in p.measures})
    for k, p in enumerate(parts):
        missing = [n for n in names if n not in p.measures]
        if missing:  # the same options on every rank: all raise together
            raise SortpackError(f"mixture source {k} has no measure {missing[0]} (every source must measure it)",
                                collective=True)
    return {n: np.concatenate([p.measures[n] for p in parts]) if parts else np.zeros(0, np.int64) for n in names}


def global_ids(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Return the global ids of contiguous-numbering ids (``union_sources``'s table), in place."""
    seg = np.searchsorted(table[:, 0], ids, side="right") - 1
    ids += (table[:, 1] - table[:, 0])[seg]
    return ids


def piece_sources(sample_id: np.ndarray, bases: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
    """Return the source (int64) of each sample or piece of the union from its sample id (pure).

    ``table`` (sources analyzed apart): the ids are the union's contiguous numbers, mapped to
    global ids first (``global_ids``); ``bases`` are the sources' first global ids plus the end.
    """
    ids = np.asarray(sample_id, dtype=np.int64)
    if table is not None:
        ids = global_ids(table, ids.copy())
    return (np.searchsorted(bases, ids, side="right") - 1).astype(np.int64)


def split_union(comm: Comm, union: Union, plan: PlanOptions, holdout: Holdout | None = None) -> tuple[Union, dict]:
    """Return (the union with every sample over the budget cut into pieces, the split's counts).

    Cut right after analyze, before the sort, as ``run`` cuts (``stages.split``): a piece is a
    sample of its document's source (``groups``), sorted by its own size. ``plan`` as for
    ``split_oversize`` (``--size bytes``: the column cut between characters, at the cuts
    analyze placed, ``union.cuts``). ``holdout``: the counts are the training plan's
    documents', ``split["held"]`` the held-out plan's. Collective.
    """
    table, bases = union.sources.table, union.sources.bases
    held_out = None
    if holdout is not None:
        def held_out(ids: np.ndarray) -> np.ndarray:
            return holdout.mask(ids if table is None else global_ids(table, ids.copy()))
    samples, split = split_oversize(comm, union.samples, plan, union.cuts, held_out)
    groups = union.groups
    if samples.begin is not None:  # pieces: one source per piece, from its document's id
        groups = piece_sources(samples.sample_id, bases, table)
    return dataclasses.replace(union, samples=samples, groups=groups), split


def holdout_plan(mix: Mixture, value: int | float | None, seed: int | None, bases: np.ndarray) -> Holdout | None:
    """Return what each source holds out: its own ``holdout``, else ``value`` (--holdout; None: nothing anywhere).

    ``seed`` is --holdout-seed (None: MIX.json's ``holdout_seed``, else the default seed).
    """
    requests = [src.holdout if src.holdout is not None else value for src in mix.sources]
    seed = seed if seed is not None else mix.holdout_seed
    return Holdout.plan(requests, bases, list(mix.names), DEFAULT_SEED if seed is None else seed,
                        what="--holdout" if any(src.holdout is None for src in mix.sources) else "holdout")



# --- the union's analysis ------------------------------------------------------------------

def own_column(mix: Mixture, aopts: AnalyzeOptions) -> str | None:
    """Return the first source that reads a column other than the plan's, as ``"'name' reads 'column'"`` (or None)."""
    return next((f"{src.name!r} reads {src.column!r}" for src in mix.sources
                 if src.column and src.column != aopts.column), None)


def analyze_union(comm: Comm, mix: Mixture, aopts: AnalyzeOptions, read: ReadWith) -> Union:
    """Return this rank's union of the sources, analyzed with the run's SPECs (collective).

    Sources reading one column are analyzed as one input (``read.cuts``: the byte cuts placed
    while it reads); else each apart, numbered contiguously for the sort (the table maps the
    numbers back: ``global_ids``); ``--size bytes --oversize split`` is refused then.
    """
    if own_column(mix, aopts) is None:
        samples, bases, file_counts = _analyze_together(comm, mix, aopts, read)
        return Union(samples, source_of(samples, bases), Sources(bases, samples.files, file_counts), read.cuts)
    parts = [_analyze_source(comm, mix, s, aopts, read) for s in range(len(mix.sources))]
    if read.tokens is not None:  # this rank's ids are a run of rows per source
        firsts = np.concatenate(([0], np.cumsum([p.total for p in parts])))
        read.tokens.set_runs([(int(firsts[s]) + p.start, len(p)) for s, p in enumerate(parts)])
    samples, groups, table, bases, files = union_sources(comm, parts)
    return Union(samples, groups, Sources(bases, files, [len(p.files) for p in parts], table), read.cuts)


def _analyze_source(comm: Comm, mix: Mixture, k: int, aopts: AnalyzeOptions, read: ReadWith) -> SampleColumns:
    """Return this rank's slice of source ``k``'s samples (ids counted within the source)."""
    src = mix.sources[k]
    opts = dataclasses.replace(aopts, column=src.column or aopts.column)
    try:
        return analyze(comm, src.inputs, opts, read.progress, Keepers(read.tokens))
    except SortpackError as exc:
        raise SortpackError(f"mixture source {src.name!r}: {exc}", collective=exc.collective) from None


def _analyze_together(comm: Comm, mix: Mixture, aopts: AnalyzeOptions, read: ReadWith
                      ) -> tuple[SampleColumns, np.ndarray, list[int]]:
    """Return (the union analyzed as one input, the sources' first global ids plus the end, files per source).

    When every source reads the same column, one analyze of the sources' inputs in order is the
    union's analyze: each rank's rows are contiguous global ids, as for any plan.
    """
    from ...inputs.discover import expand_inputs

    def count():
        return [len(expand_inputs(src.inputs, aopts.input_format, aopts.split)) for src in mix.sources]

    counts = comm.bcast_obj(comm.collectively(lambda: count() if comm.is_root() else None))
    opts = dataclasses.replace(aopts, column=mix.sources[0].column or aopts.column)
    try:
        samples = analyze(comm, [p for src in mix.sources for p in src.inputs], opts, read.progress,
                          Keepers(read.tokens, read.cuts))
    except SortpackError as exc:
        if exc.collective:  # every rank is here: find the source at fault, to name it
            for k in range(len(mix.sources)):
                _analyze_source(comm, mix, k, aopts, ReadWith())
        raise
    file_rows = np.array([int(f["rows"]) for f in samples.files], dtype=np.int64)
    return samples, source_bases(file_rows, counts, list(mix.names)), counts
