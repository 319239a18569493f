"""``sortpack export PLAN --to megatron``: the plan as a Megatron ``PREFIX.bin``/``PREFIX.idx``, written by every rank.

One sequence per planned sample (a document, a piece, a row's member) in plan order; the
plan's micro-batches are Megatron's documents. Each rank takes a contiguous range of
micro-batches (``partition.even_range``), measures its samples' lengths without reading a
token, and one exclusive scan of its sequences and tokens says where its part of each file
starts; every rank then writes its lengths, pointers, document indices and tokens at those
offsets in files rank 0 sized. The bytes depend on the plan alone, never on the rank count.

The tokens take the smallest dtype that holds them (``format.megatron.smallest_dtype``):
that of ``vocab_size`` when given, else of the ids' range over the whole plan (one pass of
min and max, skipped when the source's dtype bounds it). A fine-tuning plan's labels go to
a second prefix, ``PREFIX_labels``, in the smallest signed dtype holding them (-100 included).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...errors import SortpackError
from ...format.megatron import IndexLayout, header, index_arrays, smallest_dtype
from ...parallel import Comm, fault_point
from ...partition import even_range
from ..file_outputs import FileOutputs
from .plan_tokens import PlanTokens

CHUNK_TOKENS = 1 << 22  # tokens read, converted and written at once per rank (the buffer's size)
LABELS_SUFFIX = "_labels"


def megatron_paths(prefix: str | Path, labels: bool) -> list[Path]:
    """Return the files an export to ``prefix`` writes, in the order they are moved into place (labels first,
    each ``.bin`` before the ``.idx`` that names it)."""
    base = str(prefix)
    prefixes = ([base + LABELS_SUFFIX] if labels else []) + [base]
    return [Path(p + ext) for p in prefixes for ext in (".bin", ".idx")]


class Share(NamedTuple):
    """One rank's part of the export: micro-batches ``[lo, hi)``, their samples' lengths, where its part starts."""

    lo: int
    hi: int
    num_samples: np.ndarray  # per micro-batch
    lengths: np.ndarray  # per sample
    first_row: int  # its first sample in plan order
    first_token: int  # its first token in .bin
    chunks: list[tuple[int, int]]  # micro-batch ranges read and written at once

    def row_of(self, mb: int) -> int:
        """Return the plan-order row of the first sample of micro-batch ``mb`` (one of this share's)."""
        return self.first_row + int(self.num_samples[:mb - self.lo].sum())


def _share(comm: Comm, plan: PlanTokens) -> Share:
    """Return this rank's ``Share`` (collective: two exclusive scans, the reads checked on every rank together)."""
    lo, hi = even_range(plan.num_microbatches, rank=comm.rank, size=comm.size)
    num_samples = comm.collectively(plan.sizes, lo, hi)
    first_row = comm.exscan(int(num_samples.sum()))
    comm.collectively(plan.check, lo, hi)  # the index shards read: their hashes, before any write
    comm.collectively(plan.hold, lo, hi, first_row, int(num_samples.sum()))
    lengths = comm.collectively(lambda: np.diff(plan.read(lo, hi, first_row, values=False).offsets))
    first_token = comm.exscan(int(lengths.sum()))
    return Share(lo, hi, num_samples, lengths, first_row, first_token, _chunks(lo, num_samples, lengths))


def _chunks(lo: int, num_samples: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]]:
    """Return runs of micro-batches from ``lo`` of about ``CHUNK_TOKENS`` tokens each (at least one micro-batch)."""
    ends = np.cumsum(num_samples)
    tokens = np.concatenate(([0], np.cumsum(lengths)))
    mb_tokens = tokens[ends] - tokens[ends - num_samples]
    out, start, held = [], 0, 0
    for j, t in enumerate(mb_tokens.tolist()):
        if held and held + t > CHUNK_TOKENS:
            out.append((lo + start, lo + j))
            start, held = j, 0
        held += t
    if start < len(mb_tokens):
        out.append((lo + start, lo + len(mb_tokens)))
    return out


def _local_ranges(plan: PlanTokens, share: Share, ids: bool) -> np.ndarray:
    """Return [ids low, labels low, ids high, labels high] over this rank's samples (``ids``: scan the ids too)."""
    big = np.iinfo(np.int64)
    out = np.array([big.max, big.max, big.min, big.min], dtype=np.int64)
    if ids or plan.labels is not None:
        for a, b in share.chunks:
            chunk = plan.read(a, b, share.row_of(a))
            for k, arr in enumerate((chunk.values if ids else None, chunk.labels)):
                if arr is not None and len(arr):
                    out[k], out[k + 2] = min(out[k], int(arr.min())), max(out[k + 2], int(arr.max()))
    return out


def _dtypes(comm: Comm, plan: PlanTokens, share: Share, vocab: int | None) -> list[np.dtype]:
    """Return the dtype of the ids and, with labels, of the labels: the smallest holding them over the whole plan.

    The ids are not scanned when ``vocab`` bounds them or the source's dtype does (uint8 and
    uint16 Megatron datasets fit uint16). Collective.
    """
    source = plan.source_dtypes()
    bounded = vocab is not None or (source is not None and all(d.kind == "u" and d.itemsize <= 2 for d in source))
    local = comm.collectively(_local_ranges, plan, share, not bounded)
    low = comm.allreduce(local[:2].copy(), "min")
    high = comm.allreduce(local[2:].copy(), "max")
    ids = (0, (vocab - 1) if vocab is not None else 0xFFFF) if bounded else (int(low[0]), int(high[0]))
    dtypes = [smallest_dtype(*(ids if ids[0] <= ids[1] else (0, 0)))]  # (a plan of no tokens: uint16)
    if plan.labels is not None:
        dtypes.append(smallest_dtype(*((int(low[1]), int(high[1])) if low[1] <= high[1] else (-100, 0))))
    return dtypes


def _write_at(fd: int, offset: int, arr: np.ndarray) -> None:
    """Write ``arr``'s bytes at ``offset`` of file ``fd`` (a loop: ``pwrite`` may write part)."""
    view = np.ascontiguousarray(arr).data.cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class _Target(NamedTuple):
    """One dataset being written: its temporary files, its dtype and its layout."""

    bin: Path
    idx: Path
    dtype: np.dtype
    layout: IndexLayout


def _create(target: _Target, n: int, d: int, total_tokens: int) -> None:
    """Create the two files at their final sizes, with the header and the first document index (rank 0)."""
    with open(target.bin, "wb") as fh:
        fh.truncate(total_tokens * target.dtype.itemsize)
    with open(target.idx, "wb") as fh:
        fh.truncate(target.layout.total)
        fh.write(header(target.dtype, n, d))
        fh.seek(target.layout.documents)
        fh.write(np.zeros(1, "<i8").tobytes())


def _create_all(targets: list[_Target], n: int, d: int, total_tokens: int) -> None:
    """Create every target's files (rank 0)."""
    for t in targets:
        _create(t, n, d, total_tokens)


def _check_vocab(values: np.ndarray, vocab: int | None, where: str) -> None:
    """Raise one line when a token id lies outside ``[0, vocab)``."""
    if vocab is None or not len(values):
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= vocab:
        raise SortpackError(f"--vocab-size {vocab}: {where} hold the token id {high if high >= vocab else low}")


class _Buffers:
    """The arrays a chunk's ids and labels are written into before they go to the files: reused, grown as needed."""

    def __init__(self, dtypes: list[np.dtype]):
        self.arrays = [np.empty(0, dt) for dt in dtypes]

    def __call__(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Return arrays of ``n`` ids (and labels) of the targets' dtypes."""
        if len(self.arrays[0]) < n:
            self.arrays = [np.empty(n, a.dtype) for a in self.arrays]
        got = [a[:n] for a in self.arrays]
        return got[0], got[1] if len(got) > 1 else None


def _write_share(plan: PlanTokens, share: Share, targets: list[_Target], vocab: int | None) -> None:
    """Write this rank's lengths, pointers, document indices and tokens into every target (ids, then labels).

    A run of micro-batches at a time, its tokens gathered (or converted) into one reused
    buffer per target and written with one ``pwrite`` each: the kernel's copy into the page
    cache is the only other copy (a mapped output would fault and zero every page first).
    """
    fds = [(os.open(t.bin, os.O_WRONLY), os.open(t.idx, os.O_WRONLY)) for t in targets]
    try:
        for (_, fi), t in zip(fds, targets):
            lengths, pointers, documents = index_arrays(share.lengths, share.num_samples, share.first_row,
                                                        share.first_token, t.dtype.itemsize)
            _write_at(fi, t.layout.lengths + 4 * share.first_row, lengths)
            _write_at(fi, t.layout.pointers + 8 * share.first_row, pointers)
            _write_at(fi, t.layout.documents + 8 * (share.lo + 1), documents)
        buffers = _Buffers([t.dtype for t in targets])
        at = share.first_token
        for a, b in share.chunks:
            chunk = plan.read(a, b, share.row_of(a), into=buffers)
            _check_vocab(chunk.values, vocab, f"micro-batches {a}-{b - 1}")
            for (fb, _), t, arr in zip(fds, targets, (chunk.values, chunk.labels)):
                assert arr is not None
                _write_at(fb, at * t.dtype.itemsize, arr)
            at += len(chunk.values)
    finally:
        for fb, fi in fds:
            os.close(fb)
            os.close(fi)


def _written(fn, where: Path) -> None:
    """Run ``fn``, a write: a failure of the file system (disk full, no permission) is one line naming the output."""
    try:
        fn()
    except OSError as exc:
        raise SortpackError(f"{where}: cannot write the export ({exc.strerror or exc})") from None


def write_megatron(comm: Comm, plan: PlanTokens, out: FileOutputs, vocab: int | None = None) -> dict:
    """Write the plan as Megatron datasets into ``out`` (``megatron_paths``: ``PREFIX``, and ``PREFIX_labels`` of a
    fine-tuning plan); return what was written.

    Collective; the files appear on ``out.commit()``, which the caller runs.
    """
    share = _share(comm, plan)
    dtypes = _dtypes(comm, plan, share, vocab)
    n = comm.allreduce(len(share.lengths), "sum")
    total = comm.allreduce(int(share.lengths.sum()), "sum")
    d = plan.num_microbatches + 1
    paths = out.paths
    # the ids' dataset, then the labels' (paths list the labels first: they move into place first)
    pairs = [(paths[-2], paths[-1])] + ([(paths[0], paths[1])] if plan.labels is not None else [])
    targets = [_Target(out.temp(b), out.temp(i), dt, IndexLayout.of(n, d)) for (b, i), dt in zip(pairs, dtypes)]
    if comm.is_root():
        comm.collectively(_written, lambda: _create_all(targets, n, d, total), out.paths[0])
    else:
        comm.collectively(lambda: None)
    comm.collectively(_written, lambda: _write_share(plan, share, targets, vocab), out.paths[0])
    fault_point(comm, "exported")
    return {"sequences": int(n), "documents": int(d - 1), "tokens": int(total), "dtype": str(dtypes[0]),
            "labels_dtype": str(dtypes[1]) if len(dtypes) > 1 else None}
