"""Stage 3: cut the sorted order into token-budgeted micro-batches.

Packing is greedy within fixed global pieces: segments of ``segment_size`` sorted samples
(2^20 by default), also cut where the curriculum stage changes. Ranks own whole segments,
so each packs its own with no communication, and the result does not depend on the rank
count; a dataset of one segment gives exactly the sequential greedy's micro-batches.

About 500 lines on purpose: PackOptions' rules (budget, shapes, static shapes, oversize) and the two
packers that apply them (greedy micro-batches, row packing) change together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import kernels
from ..distribute import global_start, redistribute
from ..errors import SortpackError
from ..parallel import Comm
from ..partition import owner_starts
from ..progress import Progress
from .samples import SampleColumns, exact_sum
from .shapes import choose_shapes

SEGMENT_SIZE = 1 << 20


class OversizeError(SortpackError):
    """Samples larger than the budget under ``--oversize error`` (``run`` adds how to keep its analysis)."""


@dataclass
class PackOptions:
    """How to cut micro-batches: budget, shape rules, oversize policy."""

    max_tokens: int | None = None
    budget: str = "padded"
    max_samples: int = 0
    batch_multiple: int = 1
    quadratic_scale: float | None = None
    pad_to_multiple: int = 0
    shapes: tuple[int, ...] = field(default_factory=tuple)
    group_size: int = 1
    same_shape: bool = False
    oversize: str = "error"
    segment_size: int = SEGMENT_SIZE
    rows: int = 0  # row length for row packing (0: off)
    rows_per_microbatch: int = 1
    max_segments: int = 0
    auto_shapes: int | None = None  # --shapes auto:K: K, and ``shapes`` is chosen by pack_samples
    static_shapes: bool = False  # every micro-batch's batch size fixed by its padded length
    keep_empty: bool = False  # keep samples of size 0 (default: dropped, counted in stats["empty"])

    def __post_init__(self):
        if self.rows and self.rows > 0 and not self.max_tokens:
            # a row-packed micro-batch holds R rows of ROW_LEN tokens: that is its budget
            self.max_tokens = self.rows * max(self.rows_per_microbatch, 1)

    def validate(self) -> None:
        """Raise SortpackError for option values that make no sense."""
        if self.max_tokens is None:
            raise SortpackError("--max-tokens N is required (or --rows ROW_LEN for row packing)")
        if self.max_tokens <= 0:
            raise SortpackError(f"--max-tokens {self.max_tokens}: must be a positive integer")
        if self.budget not in kernels.BUDGETS:
            raise SortpackError(f"--budget {self.budget!r}: expected padded, tokens or quadratic")
        q = self.quadratic_scale
        if q is not None and not (math.isfinite(q) and q > 0):
            raise SortpackError(f"--quadratic-scale {q}: must be a finite number > 0")
        if self.budget == "quadratic" and not (self.quadratic_scale and self.quadratic_scale > 0):
            raise SortpackError("--budget quadratic needs --quadratic-scale Q > 0 (cost = size + size^2/Q)")
        if self.max_samples < 0:
            raise SortpackError(f"--max-samples {self.max_samples}: must be >= 0")
        if self.batch_multiple < 1:
            raise SortpackError(f"--batch-multiple {self.batch_multiple}: must be >= 1")
        if self.pad_to_multiple < 0:
            raise SortpackError(f"--pad-to-multiple {self.pad_to_multiple}: must be >= 0")
        if self.pad_to_multiple > 1 and self.shapes:
            raise SortpackError("--pad-to-multiple and --shapes exclude each other")
        if self.shapes and (any(s <= 0 for s in self.shapes) or list(self.shapes) != sorted(set(self.shapes))):
            raise SortpackError("--shapes: expected increasing positive lengths, e.g. 128,256,512")
        self._validate_auto_static()
        if self.group_size < 1:
            raise SortpackError(f"--group-size {self.group_size}: must be >= 1")
        if self.same_shape and self.group_size < 2:
            raise SortpackError("--same-shape needs --group-size G with G >= 2")
        if self.oversize not in ("error", "skip", "truncate"):
            raise SortpackError(f"--oversize {self.oversize!r}: expected error, skip or truncate")
        if self.segment_size < 1:
            raise SortpackError("--segment-size must be positive")
        if self.rows < 0:
            raise SortpackError(f"--rows {self.rows}: must be a positive row length")
        if self.rows:
            if self.rows_per_microbatch < 1:
                raise SortpackError(f"--rows-per-microbatch {self.rows_per_microbatch}: must be >= 1")
            if self.max_segments < 0:
                raise SortpackError(f"--max-segments {self.max_segments}: must be >= 0")
            clash = [name for name, on in (("--same-shape", self.same_shape), ("--shapes", bool(self.shapes)),
                                           ("--pad-to-multiple", self.pad_to_multiple > 1),
                                           ("--max-samples", self.max_samples > 0),
                                           ("--batch-multiple", self.batch_multiple > 1),
                                           ("--shapes auto", self.auto_shapes is not None),
                                           ("--static-shapes", self.static_shapes)) if on]
            if clash:
                raise SortpackError(f"--rows packs fixed-length rows; {clash[0]} does not apply to it")
        elif self.max_segments or self.rows_per_microbatch != 1:
            raise SortpackError("--max-segments and --rows-per-microbatch need --rows ROW_LEN")

    def _validate_auto_static(self) -> None:
        """Raise SortpackError for bad ``--shapes auto:K`` / ``--static-shapes`` combinations."""
        if self.auto_shapes is not None:
            if self.auto_shapes < 1:
                raise SortpackError(f"--shapes auto:{self.auto_shapes}: K must be >= 1 (how many lengths to choose)")
            if self.pad_to_multiple > 1:
                raise SortpackError("--pad-to-multiple and --shapes auto:K exclude each other")
        if self.static_shapes:
            if not self.rounding and self.auto_shapes is None:
                raise SortpackError("--static-shapes needs --shapes L1,L2,.. (or auto:K) or --pad-to-multiple K")
            if self.same_shape:
                raise SortpackError("--static-shapes and --same-shape exclude each other "
                                    "(static shapes already fix the shape of every micro-batch of a length)")

    def as_dict(self) -> dict:
        """Return the options as recorded in manifests."""
        extra = {}
        if self.auto_shapes is not None:
            extra["shapes_request"] = f"auto:{self.auto_shapes}"  # ``shapes`` holds the chosen lengths
        if self.static_shapes:
            extra["static_shapes"] = True
        if self.keep_empty:
            extra["keep_empty"] = True
        return {**extra, "max_tokens": self.max_tokens, "budget": self.budget, "max_samples": self.max_samples,
                "batch_multiple": self.batch_multiple, "quadratic_scale": self.quadratic_scale,
                "pad_to_multiple": self.pad_to_multiple, "shapes": list(self.shapes),
                "group_size": self.group_size, "same_shape": self.same_shape, "oversize": self.oversize,
                "segment_size": self.segment_size, "rows": self.rows,
                "rows_per_microbatch": self.rows_per_microbatch, "max_segments": self.max_segments,
                "row_window": self.window()}

    def static_batch_size(self, lengths: np.ndarray) -> np.ndarray:
        """Return the fixed batch size of each padded length under ``--static-shapes``.

        The most samples the budget (and ``--max-samples``) allows at that length, rounded
        down to a multiple of ``--batch-multiple`` when at least one multiple fits.
        """
        cap = kernels.batch_capacity(lengths, self.max_tokens, self.budget, self.quadratic_scale or 1.0,
                                     self.max_samples)
        m = self.batch_multiple
        return np.where(cap >= m, cap // m * m, cap)

    def window(self) -> int:
        """Return the best-fit window of row packing (samples), 0 when rows are off."""
        return kernels.DEFAULT_ROW_WINDOW if self.rows else 0

    def oversize_mask(self, sizes: np.ndarray) -> np.ndarray:
        """Return which samples cannot fit a micro-batch (or a row) alone."""
        if self.rows:
            return np.asarray(sizes) > self.rows
        if self.budget != "quadratic" and not self.rounding:
            return np.asarray(sizes) > self.max_tokens  # cost alone is the size: no temporaries
        return self.alone_cost(sizes) > self.max_tokens

    def oversize_reason(self, largest: int) -> str:
        """Return why samples up to ``largest`` do not fit alone, naming the option to change.

        The budget is not always to blame: a sample may exceed the largest of ``--shapes``,
        ``--pad-to-multiple`` may round it past the budget, or a small ``--quadratic-scale``
        may make its cost exceed the budget although its size does not.
        """
        b = self.max_tokens
        if self.rows:
            return f"do not fit --rows {self.rows} alone (largest size {largest}); raise --rows"
        if self.shapes and largest > max(self.shapes):
            return (f"are longer than the largest of --shapes ({max(self.shapes)}; largest size {largest}); "
                    f"add a longer shape")
        length = int(self.round(np.array([largest], np.int64))[0]) if self.rounding else largest
        if self.budget == "quadratic" and largest <= b:
            q = self.quadratic_scale
            return (f"cost more than --max-tokens {b} alone under --budget quadratic with --quadratic-scale {q:g} "
                    f"(largest size {largest}, cost {largest + largest * largest / q:.4g}); raise --quadratic-scale "
                    f"or --max-tokens")
        if length > b >= largest:
            flag = f"--pad-to-multiple {self.pad_to_multiple}" if self.pad_to_multiple > 1 else "--shapes"
            return (f"are padded past --max-tokens {b} by {flag} (largest size {largest} pads to {length}); "
                    f"use a smaller {flag.split()[0]} or raise --max-tokens")
        return f"do not fit --max-tokens {b} alone (largest size {largest}); raise --max-tokens"

    @property
    def rounding(self) -> bool:
        """Return whether padded lengths are rounded to a fixed set."""
        return self.pad_to_multiple > 1 or bool(self.shapes)

    def round(self, lengths: np.ndarray) -> np.ndarray:
        """Return padded lengths for raw lengths (-1 where no shape fits)."""
        return kernels.round_lengths(lengths, self.pad_to_multiple,
                                     np.asarray(self.shapes, np.int64) if self.shapes else None)

    def alone_cost(self, sizes: np.ndarray) -> np.ndarray:
        """Return each sample's cost alone in a micro-batch (inf where no shape fits)."""
        lengths = self.round(sizes) if self.rounding else np.asarray(sizes, np.int64)
        cost = kernels.sample_cost(lengths, self.budget, self.quadratic_scale or 1.0).astype(np.float64)
        cost[lengths < 0] = np.inf
        return cost

    def truncate_length(self) -> int:
        """Return the largest sample length that fits the budget alone (for --oversize truncate)."""
        b = self.max_tokens
        if self.rows:
            return self.rows
        if self.budget == "quadratic":
            q = self.quadratic_scale
            cap = int(math.floor(q * (math.sqrt(1.0 + 4.0 * b / q) - 1.0) / 2.0)) + 2
            while cap > 0 and cap + cap * cap / q > b:
                cap -= 1
        else:
            cap = b
        if self.shapes:
            fitting = [s for s in self.shapes if s <= cap]
            if not fitting:
                raise SortpackError(f"--shapes: no shape fits --max-tokens {b} alone")
            return fitting[-1]
        if self.pad_to_multiple > 1:
            cap = (cap // self.pad_to_multiple) * self.pad_to_multiple
            if cap <= 0:
                raise SortpackError(f"--pad-to-multiple {self.pad_to_multiple} exceeds --max-tokens {b}")
        return cap


@dataclass
class Microbatches:
    """One rank's micro-batches: per-micro-batch columns and the flat sample ids."""

    first: int  # global number of the first local micro-batch
    total: int  # micro-batches over all ranks
    sample_ids: np.ndarray
    offsets: np.ndarray  # len M+1, local offsets into sample_ids
    columns: dict[str, np.ndarray]
    stats: dict
    row_sizes: np.ndarray | None = None  # rows mode: samples per row, rows in order


def _oversize(comm: Comm, samples: SampleColumns, opts: PackOptions) -> tuple[SampleColumns, dict]:
    """Return the samples after the --oversize policy, and counts of what it did."""
    over = opts.oversize_mask(samples.size)
    count = comm.allreduce(int(over.sum()), "sum")
    largest = comm.allreduce(int(samples.size[over].max()) if over.any() else 0, "max")
    info = {"oversize": count, "skipped": 0, "truncated": 0}
    if count == 0:
        return samples, info
    if opts.oversize == "error":
        raise OversizeError(f"{count} samples {opts.oversize_reason(largest)}, or use --oversize skip|truncate",
                            collective=True)
    if opts.oversize == "skip":
        keep = ~over
        info["skipped"] = count
        return SampleColumns(samples.start, samples.total, samples.sample_id[keep], samples.size[keep],
                       samples.difficulty[keep], samples.stage[keep], samples.files), info
    size = samples.size.copy()
    size[over] = opts.truncate_length()
    info["truncated"] = count
    return SampleColumns(samples.start, samples.total, samples.sample_id, size, samples.difficulty,
                   samples.stage, samples.files), info


def _drop_empty(comm: Comm, samples: SampleColumns, opts: PackOptions) -> tuple[SampleColumns, int]:
    """Return the samples without those of size 0 (unless ``keep_empty``) and how many there were over all ranks.

    An empty sample has no token to train on: alone or together, empty samples make
    micro-batches of pure padding. The rest keep their order and sample ids; positions
    close up globally, so the packing does not depend on the rank count.
    """
    empty = samples.size == 0
    count = comm.allreduce(int(empty.sum()), "sum")
    if count == 0 or opts.keep_empty:
        return samples, count
    keep = ~empty
    start, total = global_start(comm, int(keep.sum()))
    stage = samples.stage[keep] if samples.stage is not None else None
    size = samples.size[keep]
    difficulty = size if samples.difficulty is samples.size else samples.difficulty[keep]
    return SampleColumns(start, total, samples.sample_id[keep], size, difficulty, stage, samples.files), count


def _piece_starts(start: int, stage: np.ndarray, segment_size: int) -> np.ndarray:
    """Return local indices where a packing piece starts (a new segment or a new stage).

    This rank holds global positions ``[start, start + len(stage))``.
    """
    n = len(stage)
    if n == 0:
        return np.zeros(0, np.int64)
    first_seg = -(-start // segment_size) * segment_size - start
    seg = np.arange(first_seg, n, segment_size, dtype=np.int64)
    changes = np.flatnonzero(stage[1:] != stage[:-1]) + 1
    return np.unique(np.concatenate(([0], seg, changes)))


def _greedy(sizes: np.ndarray, opts: PackOptions) -> np.ndarray:
    """Return micro-batch (or same-shape super-batch) boundaries for one piece."""
    g = opts.group_size if opts.same_shape else 1
    budget = opts.budget
    shapes = np.asarray(opts.shapes, np.int64) if opts.shapes else None
    if opts.same_shape and not opts.rounding:
        # A same-shape group pads every sample to one length L, so each costs as if it
        # were L long: tokens becomes c*L (the padded rule) and quadratic c*(L + L^2/Q),
        # which the kernel applies when lengths are rounded -- here to themselves.
        if budget == "tokens":
            budget = "padded"
        elif budget == "quadratic":
            shapes = np.unique(sizes)
    return kernels.greedy_pack(sizes, opts.max_tokens * g, budget, opts.max_samples * g,
                               opts.batch_multiple * g, opts.quadratic_scale or 1.0,
                               opts.pad_to_multiple, shapes)


def pack_samples(comm: Comm, samples: SampleColumns, opts: PackOptions, key: str = "size") -> Microbatches:
    """Return this rank's micro-batches of globally sorted samples.

    ``samples`` must be in global sorted order (rank r holding the r-th range);
    ``key`` names the sort key recorded as ``min_key``/``max_key``. With ``opts.auto_shapes``,
    the chosen lengths are stored in ``opts.shapes`` (so that ``opts.as_dict()`` records them).
    """
    if opts.auto_shapes is not None:
        opts.shapes = ()  # chosen below from this data, also when the options are reused
    opts.validate()
    if samples.stage is None:
        samples.stage = np.zeros(len(samples), np.int16)
    samples, empty = _drop_empty(comm, samples, opts)
    if opts.rows:
        samples, info = _oversize(comm, samples, opts)
        keyvals = (samples.size if key == "size" else samples.difficulty).astype(np.float64)
        sample_ids, sizes, keyvals, stage_of, starts, ends = _deal_to_windows(comm, samples, keyvals, opts)
        mb, perm, row_sizes = _pack_rows(starts, ends, sizes, opts)
        sample_ids, keyvals, stage_of = sample_ids[perm], keyvals[perm], stage_of[perm]
    else:
        sample_ids, keyvals, stage_of, mb, info = _pack_greedy(comm, samples, opts, key)
        row_sizes = None
    n = len(sample_ids)
    offsets = mb["offsets"]
    m = len(offsets) - 1
    min_key = _segment_reduce(np.minimum, keyvals, offsets)
    max_key = _segment_reduce(np.maximum, keyvals, offsets)
    real_starts = offsets[:-1]
    stage = stage_of[np.minimum(real_starts, max(n - 1, 0))] if n else np.zeros(m, np.int16)
    columns = {
        "num_samples": mb["num_samples"].astype(np.int32),
        "batch_size": mb["batch_size"].astype(np.int32),
        "max_size": mb["max_size"],
        "padded_size": mb["padded_size"],
        "tokens": mb["tokens"],
        "min_key": min_key,
        "max_key": max_key,
        "stage": stage.astype(np.int16),
    }
    first, total_mb = global_start(comm, m)
    info["empty"] = empty
    info["empty_dropped"] = 0 if opts.keep_empty else empty
    stats = _stats(comm, columns, info)
    return Microbatches(first, total_mb, sample_ids, mb["offsets"], columns, stats, row_sizes)


def _pack_greedy(comm: Comm, samples: SampleColumns, opts: PackOptions, key: str):
    """Return (sample ids, keys, stages, per-micro-batch arrays, oversize info) of greedy packing."""
    # ranks must own whole segments so that pieces never straddle ranks
    cols = redistribute(comm, samples.columns(), samples.start,
                        owner_starts(samples.total, opts.segment_size, comm.size))
    start, total = global_start(comm, len(cols["sample_id"]))
    samples = SampleColumns.from_columns(start, total, cols, samples.files)
    starts = _piece_starts(start, samples.stage, opts.segment_size)
    n_before = len(samples)
    samples, info = _oversize(comm, samples, opts)
    sizes = samples.size
    n = len(sizes)
    if n != n_before:
        # skipped samples shift the pieces: a piece now starts at the first kept sample
        kept_before = np.concatenate(([0], np.cumsum(~opts.oversize_mask(cols["size"]))))
        starts = np.unique(kept_before[starts])
        starts = starts[starts < n]
    ends = np.concatenate((starts[1:], [n])) if len(starts) else np.zeros(0, np.int64)
    if opts.auto_shapes is not None:
        # after --oversize: skipped samples do not count, truncated ones count at their cut size
        opts.shapes, info["auto_shapes"] = choose_shapes(comm, sizes, opts.auto_shapes)
    bounds = [np.zeros(1, np.int64)]
    prog = Progress("pack", n, "rows", ranks=comm.size, job_total=total)
    for a, b in zip(starts, ends):
        bounds.append(_greedy(sizes[a:b], opts)[1:] + a)
        prog.update(b - a)
    prog.close()
    bounds = np.concatenate(bounds)
    mb = _split_groups(bounds, sizes, opts) if opts.same_shape else _describe(bounds, sizes, opts)
    if opts.static_shapes:
        mb = _static(bounds, sizes, opts)
    keyvals = (samples.size if key == "size" else samples.difficulty).astype(np.float64)
    return samples.sample_id, keyvals, samples.stage, mb, info


def _deal_to_windows(comm: Comm, samples: SampleColumns, keyvals: np.ndarray, opts: PackOptions):
    """Return this rank's row-packing windows: (ids, sizes, keys, stages, window starts, ends).

    A window takes every K-th sample of a curriculum stage in sorted order (K windows per
    stage of ``window`` samples each), so each window spans the stage's whole size range:
    best-fit then fills rows as well as over the whole stage. Windows are numbered
    globally and dealt to ranks in contiguous blocks (one Alltoallv); inside a window
    samples keep their sorted order. Nothing depends on the number of ranks.
    """
    n = len(samples.sample_id)
    start, total = global_start(comm, n)
    stage = samples.stage.astype(np.int64)
    width = comm.allreduce(int(stage.max()) + 1 if n else 1, "max")
    per_stage = comm.allreduce(np.bincount(stage, minlength=width).astype(np.int64), "sum")
    stage_first = np.concatenate(([0], np.cumsum(per_stage)[:-1]))
    windows = -(-per_stage // opts.window())
    window_first = np.concatenate(([0], np.cumsum(windows)[:-1]))
    total_windows = max(int(windows.sum()), 1)
    pos = np.arange(start, start + n, dtype=np.int64)
    window = window_first[stage] + (pos - stage_first[stage]) % np.maximum(windows[stage], 1)
    dest = (window * comm.size) // total_windows
    order = np.argsort(dest, kind="stable")
    cols = {"id": samples.sample_id[order], "size": samples.size[order], "key": keyvals[order],
            "stage": samples.stage[order], "window": window[order], "pos": pos[order]}
    cols = comm.alltoallv_many(cols, np.bincount(dest, minlength=comm.size))
    order = np.lexsort((cols["pos"], cols["window"]))
    cols = {k: v[order] for k, v in cols.items()}
    w = cols["window"]
    starts = np.flatnonzero(np.concatenate(([True], w[1:] != w[:-1]))) if len(w) else np.zeros(0, np.int64)
    ends = np.concatenate((starts[1:], [len(w)])) if len(w) else np.zeros(0, np.int64)
    return cols["id"], cols["size"], cols["key"], cols["stage"], starts, ends


def _describe(bounds: np.ndarray, sizes: np.ndarray, opts: PackOptions) -> dict:
    """Return per-micro-batch arrays for plain micro-batches ``sizes[b[i]:b[i+1]]``."""
    count = np.diff(bounds)
    max_size = _segment_reduce(np.maximum, sizes, bounds)
    tokens = _segment_reduce(np.add, sizes, bounds)
    padded = opts.round(max_size) if opts.rounding else max_size
    return {"offsets": bounds, "num_samples": count, "batch_size": count, "max_size": max_size,
            "padded_size": padded, "tokens": tokens}


def _static(bounds: np.ndarray, sizes: np.ndarray, opts: PackOptions) -> dict:
    """Return per-micro-batch arrays with the batch size fixed by the padded length.

    The greedy never puts more samples at length L than the budget allows, but a piece's
    last micro-batch may hold more than the batch size rounded down to --batch-multiple:
    such a micro-batch is cut into full batches and a rest (each rounds to L or less, whose
    batch size is no smaller). Missing samples become padding slots, never repeats.
    """
    mb = _describe(bounds, sizes, opts)
    slots = opts.static_batch_size(mb["padded_size"])
    count = mb["num_samples"]
    if np.any(slots < 1):
        raise RuntimeError("static shapes: a padded length holds no sample")  # oversize handling prevents it
    if np.any(count > slots):
        pieces = -(-count // slots)
        before = np.cumsum(pieces) - pieces
        nth = np.arange(int(pieces.sum()), dtype=np.int64) - np.repeat(before, pieces)
        bounds = np.concatenate((np.repeat(bounds[:-1], pieces) + nth * np.repeat(slots, pieces), bounds[-1:]))
        mb = _describe(bounds, sizes, opts)
        slots = opts.static_batch_size(mb["padded_size"])
    mb["batch_size"] = slots
    return mb


def _pack_rows(starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray, opts: PackOptions):
    """Return (per-micro-batch arrays, sample permutation, samples per row) of row packing.

    Each window ``[starts[i], ends[i])`` is packed best-fit-decreasing; every
    ``rows_per_microbatch`` consecutive rows of a window make one micro-batch.
    """
    perms, splits, mb_rows = [], [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    rows_done = 0
    prog = Progress("pack", len(sizes), "rows")
    for a, b in zip(starts, ends):
        order, row_splits = kernels.pack_rows(sizes[a:b], opts.rows, opts.max_segments)
        prog.update(b - a)
        perms.append(order + a)
        splits.append(row_splits[1:] + a)
        nrows = len(row_splits) - 1
        cut = np.arange(opts.rows_per_microbatch, nrows, opts.rows_per_microbatch, dtype=np.int64)
        mb_rows.append(np.concatenate((cut, [nrows])) + rows_done)
        rows_done += nrows
    prog.close()
    perm = np.concatenate(perms) if perms else np.zeros(0, np.int64)
    row_splits = np.concatenate(splits)
    mb_rows = np.concatenate(mb_rows)
    offsets = row_splits[mb_rows]
    ordered = sizes[perm]
    return ({"offsets": offsets, "num_samples": np.diff(offsets), "batch_size": np.diff(mb_rows),
             "max_size": _segment_reduce(np.maximum, ordered, offsets),
             "padded_size": np.full(len(offsets) - 1, opts.rows, np.int64),
             "tokens": _segment_reduce(np.add, ordered, offsets)}, perm, np.diff(row_splits))


def _split_groups(bounds: np.ndarray, sizes: np.ndarray, opts: PackOptions) -> dict:
    """Return per-micro-batch arrays after splitting each super-batch into G equal shapes.

    A super-batch of c samples becomes G micro-batches of ceil(c/G) slots each; the first
    c % G get one more real sample than the rest, whose spare slot is padding.
    """
    g = opts.group_size
    count = np.diff(bounds)
    slots = -(-count // g)
    base, extra = count // g, count % g
    j = np.tile(np.arange(g, dtype=np.int64), len(count))
    real = np.repeat(base, g) + (j < np.repeat(extra, g))
    offsets = np.concatenate(([0], np.cumsum(real)))
    max_size = _segment_reduce(np.maximum, sizes, offsets)
    tokens = _segment_reduce(np.add, sizes, offsets)
    group_max = np.maximum.reduceat(sizes, bounds[:-1]) if len(count) else np.zeros(0, np.int64)
    padded = opts.round(group_max) if opts.rounding else group_max
    return {"offsets": offsets.astype(np.int64), "num_samples": real, "batch_size": np.repeat(slots, g),
            "max_size": max_size.astype(np.int64), "padded_size": np.repeat(padded, g),
            "tokens": tokens.astype(np.int64)}


def _segment_reduce(ufunc, values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Return ``ufunc.reduce`` of ``values[offsets[i]:offsets[i+1]]`` per segment (0 when empty)."""
    out = np.zeros(len(offsets) - 1, dtype=values.dtype)
    nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
    if len(nonempty):
        # reduceat runs each range up to the next index it is given; skipping the empty
        # segments (which hold no values) makes that exactly each segment's end
        out[nonempty] = ufunc.reduceat(values, offsets[nonempty])
    return out


def _stats(comm: Comm, columns: dict, info: dict) -> dict:
    """Return the index summary (integers and ratios of integers: identical for any rank count)."""
    ns = columns["num_samples"].astype(np.int64)
    # Python ints, exact: sizes from a user's column may sum past int64
    padded_tokens = exact_sum(columns["batch_size"].astype(np.int64) * columns["padded_size"])
    parts = comm.allgather_obj((len(ns), exact_sum(ns), exact_sum(columns["tokens"]), padded_tokens))
    m, nsamp, tokens, padded = (sum(col) for col in zip(*parts))
    lo = comm.allreduce(int(ns.min()) if len(ns) else 2**62, "min")
    hi = comm.allreduce(int(ns.max()) if len(ns) else 0, "max")
    shapes = np.unique(np.stack([columns["batch_size"].astype(np.int64), columns["padded_size"]]), axis=1) \
        if len(ns) else np.zeros((2, 0), np.int64)
    all_shapes = {tuple(x) for part in comm.allgather_obj(shapes.T.tolist()) for x in part}
    return {
        "num_microbatches": m,
        "num_samples": nsamp,
        "tokens": tokens,
        "padded_tokens": padded,
        "padding_ratio": (1.0 - tokens / padded) if padded else 0.0,
        "distinct_shapes": len(all_shapes),
        "samples_per_microbatch": {"min": lo if m else 0, "max": hi, "mean": (nsamp / m) if m else 0.0},
        **info,
    }
