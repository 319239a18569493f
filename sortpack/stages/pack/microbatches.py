"""The pack stage's entry: ``pack_samples`` and what it returns (``Microbatches``).

``pack_samples`` drops empty samples (``fits``), cuts (``cut``), orders by cost where
``--balance`` asks (``balance``: the mode's order) and counts the index's statistics (``packed``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...distribute import global_start
from ...parallel import Comm
from ..samples import SampleColumns
from .balance import balance_of
from .cut import balanced_caps, pack_greedy, pack_rows
from .fits import drop_empty
from .options import PackOptions
from .packed import Packed, microbatch_stats, segment_reduce


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
    begin: np.ndarray | None = None  # --oversize split: each sample's range [begin, end) in its source sample
    end: np.ndarray | None = None
    shapes: tuple[int, ...] = ()  # the padded lengths the packing used: --shapes, or those --shapes auto:K chose


def attention_work(packed: Packed, opts: PackOptions) -> np.ndarray:
    """Return each micro-batch's attention work (int64): ``batch_size * padded_size^2`` padded, else sum of s^2.

    A document attends to itself only (varlen kernels, ``cu_seqlens``), so its work is s^2;
    a padded micro-batch computes every slot at the padded length.
    """
    mb = packed.batches
    if opts.padded_layout:
        padded = np.asarray(mb.padded_size, np.int64)
        return np.asarray(mb.batch_size, np.int64) * padded * padded
    sizes = packed.sizes.astype(np.int64) if packed.sizes is not None else np.zeros(0, np.int64)
    return segment_reduce(np.add, sizes * sizes, mb.offsets).astype(np.int64)


def cap_fills(columns: dict[str, np.ndarray], opts: PackOptions) -> dict[str, np.ndarray]:
    """Return each micro-batch's fill of the budget (``max_tokens``) and of every cap (its measure's name).

    The budget's use is what it costs: padded tokens when padded, else tokens (plus attention / Q
    under ``--budget quadratic``); a cap's is its measure's sum over its limit, N per row under ``--rows``.
    """
    if opts.padded_layout:
        used = columns["batch_size"].astype(np.float64) * np.asarray(columns["padded_size"], np.float64)
    else:
        used = columns["tokens"].astype(np.float64)
        if opts.budget == "quadratic" and not opts.rows:
            used = used + columns["attention"] / opts.scale
    rows = columns["batch_size"].astype(np.float64) if opts.rows else 1.0
    fills = {"max_tokens": used / float(opts.limit)}
    for name, n in opts.cap_list:
        fills[name] = columns[name].astype(np.float64) / (float(n) * rows)
    return fills


def cap_binding(comm: Comm, columns: dict[str, np.ndarray], opts: PackOptions) -> dict[str, int]:
    """Return how many micro-batches each cap binds (its fill the largest; ties to the first), over all ranks."""
    fills = cap_fills(columns, opts)
    names = list(fills)
    top = np.argmax(np.stack(list(fills.values())), axis=0) if len(columns["tokens"]) else np.zeros(0, np.int64)
    counts = comm.allreduce(np.bincount(top, minlength=len(names)).astype(np.int64), "sum")
    return {name: int(c) for name, c in zip(names, counts)}


def pack_samples(comm: Comm, samples: SampleColumns, opts: PackOptions, key: str = "size",
                 split: dict | None = None) -> Microbatches:
    """Return this rank's micro-batches of globally sorted samples.

    ``samples`` must be in global sorted order (rank r holding the r-th range);
    ``key`` names the sort key recorded as ``min_key``/``max_key``. With ``opts.auto_shapes``,
    the chosen lengths are the result's ``shapes`` (``opts.with_shapes(mbs.shapes).as_dict()``
    records them); ``opts`` are never changed. ``split`` holds what ``--oversize split`` did
    before (``stages.split``), for the stats.
    """
    if opts.auto_shapes is not None and opts.shapes:
        opts = opts.with_shapes(())  # chosen from this data, also when given options that carry lengths
    opts.validate()
    samples, empty = drop_empty(comm, samples, opts)
    packed = pack_rows(comm, samples, opts, key) if opts.rows else pack_greedy(comm, samples, opts, key)
    # --balance: the micro-batches in the mode's order (the table's; caps under --budget tokens order by the fills)
    packed = balance_of(opts).arrange(comm, packed, by_fills=balanced_caps(opts, samples))
    mb = packed.batches
    n = len(packed.sample_ids)
    offsets = mb.offsets
    m = len(offsets) - 1
    real_starts = offsets[:-1]
    # an empty micro-batch (--same-shape: a group of fewer samples than micro-batches) closes its
    # group, so it takes the stage of the sample before it, not of the next group's first one
    first_sample = np.where(np.diff(offsets) > 0, real_starts, real_starts - 1)
    stage = packed.stage[np.clip(first_sample, 0, max(n - 1, 0))] if n else np.zeros(m, np.int16)
    columns = {
        "num_samples": mb.num_samples.astype(np.int32),
        "batch_size": mb.batch_size.astype(np.int32),
        "max_size": mb.max_size,
        "padded_size": mb.padded_size,
        "tokens": mb.tokens,
        # float64 after the reduction: min(float(k)) == float(min(k)), without a float copy of every key
        "min_key": segment_reduce(np.minimum, packed.keys, offsets).astype(np.float64),
        "max_key": segment_reduce(np.maximum, packed.keys, offsets).astype(np.float64),
        "stage": stage.astype(np.int16),
        "attention": attention_work(packed, opts),
    }
    for name in sorted(packed.measures):  # each measure summed per micro-batch, a column of its name
        columns[name] = segment_reduce(np.add, packed.measures[name].astype(np.int64, copy=False), offsets)
    first, total_mb = global_start(comm, m)
    info = {**packed.info, "empty": empty, "empty_dropped": 0 if opts.keep_empty else empty}
    if opts.oversize == "split":
        info.update(split or {"split": 0, "split_pieces": 0, "split_tokens": 0})
        info["oversize"] = info["split"]
    elif split:  # --oversize truncate of fine-tuning data: the targets it cut (run counts them)
        info.update(split)
    if opts.caps or opts.cap_fit != "auto":  # one --max-size2 alone: the plan keeps the bytes it had
        info["cap_binding"] = cap_binding(comm, columns, opts)
    stats = microbatch_stats(comm, columns, info)
    return Microbatches(first, total_mb, packed.sample_ids, offsets, columns, stats, packed.row_sizes,
                        packed.begin, packed.end, packed.shapes)
