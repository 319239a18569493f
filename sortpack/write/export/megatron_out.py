"""``sortpack export PLAN --to megatron``: the plan as a Megatron ``PREFIX.bin``/``PREFIX.idx``, written by every rank.

One sequence per planned sample (a document, a piece, a row's member) in plan order; the
plan's micro-batches are Megatron's documents. Each rank takes a contiguous range of
micro-batches (``partition.even_range``), finds where its samples lie without reading a
token (``PlanTokens.runs``), and one exclusive scan of its sequences and tokens says where
its part of each file starts; every rank then writes its lengths, pointers, document
indices and tokens at those offsets in files rank 0 sized. The bytes depend on the plan
alone, never on the rank count.

The tokens take the smallest dtype that holds them (``format.megatron.smallest_dtype``):
that of ``vocab_size`` when given or when the source's dtype bounds them, else that of the
ids' range over the whole plan. That range is measured while the tokens are written, in the
dtype the first chunk of every rank asks for: a plan whose later ids need a wider one is
written again in it (the ids rarely outgrow their first millions). A fine-tuning plan's
labels go to a second prefix, ``PREFIX_labels``, in the smallest signed dtype holding them
(-100 included), found the same way.

The tokens go out a chunk of micro-batches at a time (``chunk_writer``): each chunk's
samples gathered and converted by the compiled run copy into a buffer of the worker's own,
then written with ``pwrite``, two workers at once.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...errors import SortpackError
from ...format.megatron import IndexLayout, header, index_arrays, smallest_dtype
from ...kernels.runs import NO_RANGE, copy_runs, pwrite_all
from ...parallel import Comm, fault_point
from ...partition import even_range
from ..file_outputs import FileOutputs
from .chunk_writer import Share, Target, chunk_tokens, chunks, reserve, runs_of, write_chunks
from .plan_tokens import PlanTokens

LABELS_SUFFIX = "_labels"
GUESS_TOKENS = 1 << 18  # the tokens of each rank whose range picks the dtype to write in (at most a chunk's)


def megatron_paths(prefix: str | Path, labels: bool) -> list[Path]:
    """Return the files an export to ``prefix`` writes, in the order they are moved into place (labels first,
    each ``.bin`` before the ``.idx`` that names it)."""
    base = str(prefix)
    prefixes = ([base + LABELS_SUFFIX] if labels else []) + [base]
    return [Path(p + ext) for p in prefixes for ext in (".bin", ".idx")]


def _share(comm: Comm, plan: PlanTokens) -> Share:
    """Return this rank's ``Share`` (collective: two exclusive scans, the reads checked on every rank together)."""
    lo, hi = even_range(plan.num_microbatches, rank=comm.rank, size=comm.size)
    comm.collectively(plan.check, lo, hi)  # the index shards read: their hashes, before any write
    num_samples = comm.collectively(plan.hold, lo, hi)
    first_row = comm.exscan(int(num_samples.sum()))
    comm.collectively(plan.hold_rows, first_row, int(num_samples.sum()))
    where = comm.collectively(plan.runs, lo, hi, first_row)
    first_token = comm.exscan(int(where.ids.counts.sum()))
    return Share(lo, num_samples, first_row, first_token, where, chunks(lo, num_samples, where.ids.counts))


class _Kinds(NamedTuple):
    """The dtypes the ids and labels are written in, and whether each is certain (else guessed from the first
    tokens)."""

    dtypes: list[np.dtype]
    certain: list[bool]


def _first_ranges(plan: PlanTokens, share: Share, certain: list[bool]) -> np.ndarray:
    """Return (low, high, over) of the first ``GUESS_TOKENS`` ids and labels of the share (NO_RANGE where
    ``certain`` or none), one row each."""
    out = np.array([NO_RANGE] * len(certain), dtype=np.int64)
    if share.chunks and not all(certain):
        for k, runs in enumerate(runs_of(plan, share, share.chunks[0])):
            if runs is not None and not certain[k]:
                enough = int(np.searchsorted(np.cumsum(runs.counts), min(GUESS_TOKENS, chunk_tokens()))) + 1
                out[k] = copy_runs(runs.part(0, enough), None)[1]
    return out


def _kinds(comm: Comm, plan: PlanTokens, share: Share, vocab: int | None) -> _Kinds:
    """Return the dtypes to write in: certain for ids that ``vocab`` or the source's dtype bounds (uint8 and uint16
    Megatron datasets fit uint16), else guessed from the first ``GUESS_TOKENS`` of every rank. Collective."""
    source = plan.source_dtypes()
    bounded = vocab is not None or (source is not None and all(d.kind == "u" and d.itemsize <= 2 for d in source))
    certain = [bounded] + ([False] if plan.labels is not None else [])
    ranges = _reduced(comm, comm.collectively(_first_ranges, plan, share, certain))
    ids = smallest_dtype(0, (vocab - 1) if vocab is not None else 0xFFFF) if bounded else _smallest(ranges[0], 0)
    return _Kinds([ids] + ([_smallest(ranges[1], -100)] if len(certain) > 1 else []), certain)


def _reduced(comm: Comm, ranges: np.ndarray) -> np.ndarray:
    """Return every rank's (low, high, over) rows combined: the lowest low, the highest high, any over."""
    low = comm.allreduce(np.ascontiguousarray(ranges[:, 0]), "min")
    rest = comm.allreduce(np.ascontiguousarray(ranges[:, 1:]), "max")
    return np.column_stack([low, rest])


def _smallest(rng: np.ndarray, empty_low: int) -> np.dtype:
    """Return the smallest Megatron dtype of a (low, high, over) range (none: of ``[empty_low, 0]``)."""
    low, high, over = (int(x) for x in rng)
    if over:
        raise SortpackError(f"a token value above {np.iinfo(np.int64).max} fits no Megatron dtype (int64 at most)")
    return smallest_dtype(*((low, high) if low <= high else (empty_low, 0)))


class _Sizes(NamedTuple):
    """The whole export's sequences, document indices and tokens."""

    sequences: int
    documents: int
    tokens: int


def _create(target: Target, n: int, d: int, total_tokens: int) -> None:
    """Create the two files at their final sizes (``.bin`` allocated), with the header and the first document index
    (rank 0)."""
    with open(target.bin, "wb") as fh:
        reserve(fh.fileno(), total_tokens * target.dtype.itemsize)
    with open(target.idx, "wb") as fh:
        fh.truncate(target.layout.total)
        fh.write(header(target.dtype, n, d))
        fh.seek(target.layout.documents)
        fh.write(np.zeros(1, "<i8").tobytes())


def _create_all(targets: list[Target], sizes: _Sizes) -> None:
    """Create every target's files (rank 0)."""
    for t in targets:
        _create(t, *sizes)


def _write_index(fd: int, share: Share, target: Target) -> None:
    """Write this rank's lengths, pointers and document indices into ``target``'s ``.idx`` (open as ``fd``)."""
    lengths, pointers, documents = index_arrays(share.where.ids.counts, share.num_samples, share.first_row,
                                                share.first_token, target.dtype.itemsize)
    pwrite_all(fd, lengths, target.layout.lengths + 4 * share.first_row)
    pwrite_all(fd, pointers, target.layout.pointers + 8 * share.first_row)
    pwrite_all(fd, documents, target.layout.documents + 8 * (share.lo + 1))


def _check_vocab(ids: np.ndarray, vocab: int | None) -> None:
    """Raise one line when the plan's ids (``ids``: their low, high, over over the whole plan) leave ``[0, vocab)``:
    the same line at any rank count."""
    if vocab is None:
        return
    low, high, over = (int(x) for x in ids)
    if low <= high and (low < 0 or high >= vocab or over):
        raise SortpackError(f"--vocab-size {vocab}: the plan holds the token id "
                            f"{high if high >= vocab or over else low} (ids must lie in [0, {vocab}))",
                            collective=True)


def _written(fn, where: Path):
    """Return ``fn()``, a write: a failure of the file system (disk full, no permission) is one line naming the
    output."""
    try:
        return fn()
    except OSError as exc:
        raise SortpackError(f"{where}: cannot write the export ({exc.strerror or exc})") from None


class _Job(NamedTuple):
    """What every pass of the writes shares: the plan, this rank's part, the sizes, ``--vocab-size``, the output named
    in a failure's line."""

    plan: PlanTokens
    share: Share
    sizes: _Sizes
    vocab: int | None
    where: Path


def _write_all(comm: Comm, job: _Job, targets: list[Target]) -> np.ndarray:
    """Create the targets (rank 0) and write this rank's part of each; return the (low, high, over) each target's
    values took over the whole plan (NO_RANGE where not measured). Collective."""
    if comm.is_root():
        comm.collectively(_written, lambda: _create_all(targets, job.sizes), job.where)
    else:
        comm.collectively(lambda: None)

    def index() -> None:
        for t in targets:
            with open(t.idx, "r+b") as fh:
                _write_index(fh.fileno(), job.share, t)

    def local() -> np.ndarray:
        return _combined(write_chunks(job.plan, job.share, targets, index), len(targets))

    ranges = _reduced(comm, comm.collectively(_written, local, job.where))
    _check_vocab(ranges[0], job.vocab)
    return ranges


def _combined(ranges: np.ndarray, k: int) -> np.ndarray:
    """Return the (low, high, over) of each of ``k`` targets over every chunk (``ranges[chunk, target]``)."""
    if not len(ranges):
        return np.array([NO_RANGE] * k, dtype=np.int64)
    return np.column_stack([ranges[:, :, 0].min(axis=0), ranges[:, :, 1].max(axis=0), ranges[:, :, 2].max(axis=0)])


def write_megatron(comm: Comm, plan: PlanTokens, out: FileOutputs, vocab: int | None = None) -> dict:
    """Write the plan as Megatron datasets into ``out`` (``megatron_paths``: ``PREFIX``, and ``PREFIX_labels`` of a
    fine-tuning plan); return what was written.

    Collective; the files appear on ``out.commit()``, which the caller runs.
    """
    share = _share(comm, plan)
    kinds = _kinds(comm, plan, share, vocab)
    counts = share.where.ids.counts
    sizes = _Sizes(comm.allreduce(len(counts), "sum"), plan.num_microbatches + 1,
                   comm.allreduce(int(counts.sum()), "sum"))
    layout = IndexLayout.of(sizes.sequences, sizes.documents)
    job = _Job(plan, share, sizes, vocab, out.paths[0])
    paths = out.paths
    # the ids' dataset, then the labels' (paths list the labels first: they move into place first)
    pairs = [(paths[-2], paths[-1])] + ([(paths[0], paths[1])] if plan.labels is not None else [])
    while True:
        # measured: a guessed dtype's values, and the ids a --vocab-size bounds (each is checked)
        targets = [Target(out.temp(b), out.temp(i), dt, layout, not certain or (k == 0 and vocab is not None))
                   for k, ((b, i), dt, certain) in enumerate(zip(pairs, kinds.dtypes, kinds.certain))]
        ranges = _write_all(comm, job, targets)
        exact = [dt if certain else _smallest(rng, -100 if k else 0)
                 for k, (dt, certain, rng) in enumerate(zip(kinds.dtypes, kinds.certain, ranges))]
        if exact == kinds.dtypes:
            break
        kinds = _Kinds(exact, [True] * len(exact))  # a guess too narrow: written again, in the plan's own dtypes
    fault_point(comm, "exported")
    return {"sequences": sizes.sequences, "documents": sizes.documents - 1, "tokens": sizes.tokens,
            "dtype": str(kinds.dtypes[0]), "labels_dtype": str(kinds.dtypes[1]) if len(kinds.dtypes) > 1 else None}
