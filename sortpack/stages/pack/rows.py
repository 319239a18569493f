"""Row packing (``--rows``): samples dealt to best-fit windows, bin-packed into fixed-length rows."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ... import kernels
from ...distribute import global_start
from ...parallel import Comm
from ...partition import deal_windows
from ...progress import Progress
from ..samples import SampleColumns
from .balance import compose_rows, targets_spread
from .batches import BatchArrays, Packed, key_values, segment_reduce
from .filters import apply_oversize
from .options import PackOptions
from .two_caps import two_cap_order


@dataclass
class Windows:
    """One rank's samples grouped by best-fit window, sorted order kept inside each window."""

    sample_ids: np.ndarray
    sizes: np.ndarray
    keys: np.ndarray
    stage: np.ndarray
    starts: np.ndarray  # local index where each window starts
    ends: np.ndarray  # and where it ends
    begin: np.ndarray | None = None  # --oversize split: each sample's range start in its source sample
    measures: dict[str, np.ndarray] = field(default_factory=dict)  # the samples' measures, in window order


def deal_to_windows(comm: Comm, samples: SampleColumns, keys: np.ndarray, opts: PackOptions) -> Windows:
    """Return this rank's row-packing windows.

    A window takes every K-th sample of a curriculum stage in sorted order (K windows per
    stage of ``window`` samples each), so each window spans the stage's whole size range:
    best-fit then fills rows as well as over the whole stage. Windows are numbered
    globally and dealt to ranks in contiguous blocks (``partition.deal_windows``, then one
    Alltoallv); inside a window samples keep their sorted order. Nothing depends on the
    number of ranks.
    """
    n = len(samples.sample_id)
    start, total = global_start(comm, n)
    stage_of = samples.stage_or_zero()
    stage = stage_of.astype(np.int64)
    width = comm.allreduce(int(stage.max()) + 1 if n else 1, "max")
    per_stage = comm.allreduce(np.bincount(stage, minlength=width).astype(np.int64), "sum")
    pos = np.arange(start, start + n, dtype=np.int64)
    window, dest = deal_windows(pos, stage, per_stage, opts.window(), size=comm.size)
    order = np.argsort(dest, kind="stable")
    cols = {"id": samples.sample_id[order], "size": samples.size[order], "key": keys[order],
            "stage": stage_of[order], "window": window[order], "pos": pos[order]}
    if samples.begin is not None:
        cols["begin"] = samples.begin[order]
    cols.update({_MEASURE + k: v[order] for k, v in samples.measures.items()})
    cols = comm.alltoallv_many(cols, np.bincount(dest, minlength=comm.size))
    order = np.lexsort((cols["pos"], cols["window"]))
    cols = {k: v[order] for k, v in cols.items()}
    w = cols["window"]
    starts = np.flatnonzero(np.concatenate(([True], w[1:] != w[:-1]))) if len(w) else np.zeros(0, np.int64)
    ends = np.concatenate((starts[1:], [len(w)])) if len(w) else np.zeros(0, np.int64)
    measures = {k[len(_MEASURE):]: v for k, v in cols.items() if k.startswith(_MEASURE)}
    return Windows(cols["id"], cols["size"], cols["key"], cols["stage"], starts, ends, cols.get("begin"), measures)


_MEASURE = "measure:"  # a measure's column while it travels: its name cannot meet the window's own


def window_rows(room: np.ndarray, size2: np.ndarray | None, opts: PackOptions) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) of one window's samples packed into rows.

    Best-fit-decreasing; under two caps (``--max-size2``: each row's sum of ``size2`` at most N
    too) the window's samples in ``two_cap_order`` are cut into rows by the two-cap greedy, so
    each row holds both kinds of sample in the window's proportion.
    """
    if size2 is None:
        return kernels.pack_rows(room, opts.rows, opts.max_segments)
    n = len(room)
    order = two_cap_order(room, size2, opts.rows, opts.max_size2, np.zeros(1, np.int64), np.array([n]))
    splits = kernels.greedy_pack(room[order], opts.rows, "tokens", opts.max_segments, sizes2=size2[order],
                                 max2=opts.max_size2)
    return order, splits


def composed_rows(sizes: np.ndarray, room: np.ndarray, targets: np.ndarray, opts: PackOptions
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) of one window's rows composed by their targets (``--balance targets``).

    The rows best fit packs (the same sizes in each), with the samples of each size placed so
    that every row's targets come near the window's mean (``balance.targets_spread`` and
    ``balance.compose_rows``); the samples of a row in window order.
    """
    spread = targets_spread(sizes, targets)
    order, row_splits = window_rows(room[spread], None, opts)
    order = spread[compose_rows(sizes[spread], targets[spread], order, row_splits)]
    row = np.repeat(np.arange(len(row_splits) - 1, dtype=np.int64), np.diff(row_splits))
    return order[np.lexsort((order, row))], row_splits


def pack_rows(comm: Comm, samples: SampleColumns, opts: PackOptions, key: str) -> Packed:
    """Return this rank's row-packed micro-batches of globally sorted samples, after the ``--oversize`` policy.

    Each window is packed best-fit-decreasing; every ``rows_per_microbatch`` consecutive
    rows of a window make one micro-batch. With ``--pad-to-multiple K`` each document counts
    at its length rounded up to K (``tokens`` and ``max_size`` stay the real sizes); with
    ``--max-size2 N`` no row holds more than N of the second size (``window_rows``).
    """
    samples, info = apply_oversize(comm, samples, opts)
    win = deal_to_windows(comm, samples, key_values(samples, key), opts)
    sizes = win.sizes
    k = opts.pad_to_multiple
    # --pad-to-multiple K: a document takes its length rounded up to K in its row (context
    # parallelism pads each document to 2 x CP), so the padded rows still fit ROW_LEN
    room = -(-sizes // k) * k if k > 1 else sizes
    perms = []
    splits, mb_rows = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    rows_done = 0
    prog = Progress("pack", len(sizes), "rows")
    size2 = win.measures.get("size2") if opts.max_size2 else None
    # --balance targets: rows composed so that each carries about the same targets (balance.compose_rows)
    targets = win.measures.get("targets") if opts.balance == "targets" and size2 is None else None
    for a, b in zip(win.starts, win.ends):
        if targets is None:
            order, row_splits = window_rows(room[a:b], None if size2 is None else size2[a:b], opts)
        else:
            order, row_splits = composed_rows(sizes[a:b], room[a:b], targets[a:b], opts)
        prog.update(b - a)
        perms.append(order + a)
        splits.append(row_splits[1:] + a)
        nrows = len(row_splits) - 1
        cut = np.arange(opts.rows_per_microbatch, nrows, opts.rows_per_microbatch, dtype=np.int64)
        mb_rows.append(np.concatenate((cut, [nrows])) + rows_done)
        rows_done += nrows
    prog.close()
    perm = np.concatenate(perms) if perms else np.zeros(0, np.int64)
    row_ends = np.concatenate(splits)
    mb_row_ends = np.concatenate(mb_rows)
    offsets = row_ends[mb_row_ends]
    ordered = sizes[perm]
    batches = BatchArrays(offsets, np.diff(offsets), np.diff(mb_row_ends), segment_reduce(np.maximum, ordered, offsets),
                          np.full(len(offsets) - 1, opts.rows, np.int64), segment_reduce(np.add, ordered, offsets))
    packed = Packed(win.sample_ids[perm], win.keys[perm], win.stage[perm], batches, info, np.diff(row_ends),
                    sizes=ordered, measures={k: v[perm] for k, v in win.measures.items()})
    if win.begin is not None:
        packed.begin = win.begin[perm]
        packed.end = packed.begin + ordered
    return packed
