"""A mixture's packing: how it packs (``MixturePacking``) and every packed micro-batch's few numbers (``PackedUnits``).

Every rank gathers every packed micro-batch's tokens, samples, source and stage
(``gather_packed``: bytes per micro-batch, never per sample); the part passes are chosen from
them and the blend orders them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import kernels
from ...errors import SortpackError
from ...inputs.mixture import Mixture
from ...parallel import Comm
from ..pack import Microbatches, PackOptions
from .union import Sources

__all__ = ["MixturePacking", "PackedUnits", "concat_microbatches", "gather_packed", "held_tokens", "take_runs"]


@dataclass(frozen=True)
class MixturePacking:
    """What a mixture packs and blends with: the mixture, the pack options, the sort key and stages, its sources."""

    mix: Mixture
    popts: PackOptions
    key: str
    stages: int  # curriculum stages: the sort's stage code is source * stages + stage
    sources: Sources

    @property
    def group(self) -> int:
        """Return the packed micro-batches one blend unit holds (``--same-shape``: a group of G)."""
        return self.popts.group_size if self.popts.same_shape else 1


def take_runs(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Return ``values[starts[i] : starts[i] + lengths[i]]`` of every i, concatenated (one memcpy per run)."""
    values = np.ascontiguousarray(values)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.empty(int(lengths.sum()), dtype=values.dtype)
    width = values.dtype.itemsize
    raw = values.view(np.uint8)
    kernels.gather_bytes(np.array([raw.ctypes.data], np.uint64), [raw], np.zeros(len(lengths), np.int64),
                         np.asarray(starts, dtype=np.int64) * width, lengths * width, out.view(np.uint8))
    return out


@dataclass
class PackedUnits:
    """Every packed micro-batch's few numbers (each rank holds them all: bytes per micro-batch, not per sample).

    Each rank's micro-batches are its whole packing's, then its part passes' (``part`` true).
    """

    tokens: np.ndarray
    samples: np.ndarray
    padded: np.ndarray
    source: np.ndarray
    stage: np.ndarray
    part: np.ndarray
    firsts: np.ndarray  # packed micro-batch number where each rank's micro-batches start, plus the end
    targets: np.ndarray | None = None  # fine-tuning data: each micro-batch's loss targets

    def units(self, s: int, part: bool, group: int) -> np.ndarray:
        """Return source ``s``'s units (rows of ``group`` packed micro-batch numbers) of one packing, in pack order."""
        return np.flatnonzero((self.source == s) & (self.part == part)).reshape(-1, group)


def gather_packed(comm: Comm, mbs: Microbatches, stages: int, parts: int = 0) -> PackedUnits:
    """Return every rank's packed micro-batches' numbers (the last ``parts`` of each rank's are part-pass ones)."""
    c = mbs.columns
    code = c["stage"].astype(np.int64)
    padded = c["batch_size"].astype(np.int64) * c["padded_size"].astype(np.int64)
    m = len(c["tokens"])
    firsts = np.array([0] + [int(x) for x in np.cumsum(comm.allgather_obj(m))], dtype=np.int64)
    code_all = comm.allgatherv(code)
    part = comm.allgatherv((np.arange(m) >= m - parts).astype(np.uint8)).astype(bool)
    targets = comm.allgatherv(c["targets"].astype(np.int64)) if "targets" in c else None
    return PackedUnits(comm.allgatherv(c["tokens"].astype(np.int64)),
                       comm.allgatherv(c["num_samples"].astype(np.int64)),
                       comm.allgatherv(padded), code_all // stages, code_all % stages, part, firsts, targets)


def held_tokens(packed: PackedUnits, names: list[str], group: int) -> np.ndarray:
    """Return each source's tokens in its whole packing, refusing a source that packed to nothing."""
    held = np.zeros(len(names), dtype=np.int64)
    for s in range(len(names)):
        mine = (packed.source == s) & ~packed.part
        if not mine.any():
            raise SortpackError(f"mixture source {names[s]!r}: no micro-batches (every sample skipped)",
                                collective=True)
        if int(mine.sum()) % group:
            raise RuntimeError("same-shape groups straddle a mixture source")
        held[s] = int(packed.tokens[mine].sum())
    return held


def concat_microbatches(a: Microbatches, b: Microbatches) -> Microbatches:
    """Return this rank's micro-batches of ``a`` then ``b`` as one (numbering: the caller's)."""
    rows = None if a.row_sizes is None or b.row_sizes is None else np.concatenate((a.row_sizes, b.row_sizes))
    begin = end = None
    if a.begin is not None and b.begin is not None and a.end is not None and b.end is not None:
        # --oversize split: the pieces' ranges, parallel to the sample ids
        begin, end = np.concatenate((a.begin, b.begin)), np.concatenate((a.end, b.end))
    return Microbatches(a.first, a.total + b.total, np.concatenate((a.sample_ids, b.sample_ids)),
                        np.concatenate((a.offsets, a.offsets[-1] + b.offsets[1:])),
                        {name: np.concatenate((col, b.columns[name])) for name, col in a.columns.items()},
                        a.stats, rows, begin, end, shapes=a.shapes)
