"""Balanced steps at any world size: micro-batches ordered so that consecutive ones cost alike (the orders).

The reader deals a step's W*A consecutive micro-batches to W ranks (``batches[rank::W]``). If
consecutive micro-batches cost about the same, every rank's share of every step does too,
whatever W and A are: the plan balances steps without knowing the topology. So, once packed,
the micro-batches of each curriculum stage are sorted by their cost over all ranks (a
distributed sort of one record per micro-batch, then each rank fetches the micro-batches of its
range): W*A consecutive ones are neighbours in the cost distribution of the whole stage, which
is dense enough on a large dataset that they cost nearly the same. (Sorting inside each row
window alone leaves the tail of a window's costs too sparse: at W = 64 on 1M chat-like
lengths, p99 1.21 against 1.02 for the global order.)

What a micro-batch's cost is, and which order a ``--balance`` mode takes, is the mode's own
(``balance.BALANCE``); the orders are here: ``circle_order`` (sorted by cost, laid out as a
circle, so a short last step filled from the plan's start costs as its neighbours do) and
``global_order`` (sorted by a key: two caps (``--max-size2`` under ``--budget tokens``) order
their micro-batches by both fills, ``two_cap_key``; several caps by the two fills that vary most,
``fills_order``; ``--balance compute`` with a vision encoder by both costs along a closed
space-filling curve, ``two_cost_key``).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from ...distribute import fetch_rows
from ...kernels.gather import run_indices
from ...parallel import Comm
from ..sample_sort import sample_sort
from ..samples import exact_sum, measures_in, with_measures
from .packed import BatchArrays, Packed, segment_reduce


def both_fills_order(comm: Comm, packed: Packed, cap1: int, cap2: int, name: str = "size2") -> Packed:
    """Return this rank's part of all micro-batches ordered by both fills (two caps: tokens and the measure
    ``name``, ``size2`` by default)."""
    size2 = segment_reduce(np.add, packed.measures[name], packed.batches.offsets)
    return global_order(comm, packed, two_cap_key(comm, packed.batches.tokens, size2, (cap1, cap2)))


def _spread(comm: Comm, values: np.ndarray) -> tuple[int, int]:
    """Return (m * sum of squares - sum^2, m) of integer ``values`` over all ranks, exactly (m values)."""
    v = values.astype(np.int64)
    m = comm.allreduce(len(v), "sum")
    total = comm.allreduce(exact_sum(v), "sum")
    squares = comm.allreduce(exact_sum(v * v), "sum")  # a micro-batch's sum is under its cap: no wrap
    return m * squares - total * total, m


def two_cap_key(comm: Comm, tokens: np.ndarray, size2: np.ndarray, caps: tuple[int, int], bins: int = 40
                ) -> np.ndarray:
    """Return a key that orders micro-batches by both fills (collective).

    The fill that varies more over the plan's micro-batches (usually the cap that does not
    bind) is cut into ``bins`` bins of equal width; inside a bin micro-batches go by the
    other fill, up in one bin and down in the next (serpentine): neighbours are alike in both.
    Which fill varies more is decided on exact integer sums, so it does not depend on the rank count.
    """
    cap1, cap2 = caps
    var1, _ = _spread(comm, tokens)
    var2, _ = _spread(comm, size2)
    f1 = np.minimum(tokens.astype(np.float64) / cap1, 1.0)
    f2 = np.minimum(size2.astype(np.float64) / cap2, 1.0)
    # compare var(tokens)/cap1^2 with var(size2)/cap2^2 exactly
    first, second = (f2, f1) if var2 * cap1 * cap1 >= var1 * cap2 * cap2 else (f1, f2)
    return _serpentine(first, second, bins)


def _serpentine(first: np.ndarray, second: np.ndarray, bins: int) -> np.ndarray:
    """Return a key of ``first`` in ``bins`` bins of equal width, inside each by ``second``, up and down in turn."""
    b = np.floor(first * bins)
    return b + np.where(b % 2 == 1, 1.0 - second, second) * 0.5


def fills_order(comm: Comm, packed: Packed, limit: int, caps: tuple[tuple[str, int], ...]) -> Packed:
    """Return this rank's part of all micro-batches ordered by the two fills (tokens and each cap's) that vary most.

    As ``two_cap_key`` for two: the fill that varies more over the plan in 40 bins, the other
    inside each, serpentine; which vary most is decided on exact integer sums (any rank count).
    """
    offsets = packed.batches.offsets
    sums = [packed.batches.tokens] + [segment_reduce(np.add, packed.measures[name], offsets) for name, _ in caps]
    limits = [limit] + [n for _, n in caps]
    # var_k / cap_k^2, exactly: the spreads are exact integers over the same count of micro-batches
    spread = [Fraction(_spread(comm, v)[0], int(c) * int(c)) for v, c in zip(sums, limits)]
    ranked = sorted(range(len(sums)), key=lambda k: (spread[k], k), reverse=True)
    fills = [np.minimum(v.astype(np.float64) / c, 1.0) for v, c in zip(sums, limits)]
    key = _serpentine(fills[ranked[0]], fills[ranked[1]], 40) if len(ranked) > 1 else fills[0]
    return global_order(comm, packed, key)


CURVE_BITS = 12  # the grid of two_cost_key: 2^12 steps over the wider of the two costs' spans


def hilbert_index(x: np.ndarray, y: np.ndarray, bits: int) -> np.ndarray:
    """Return the distance along a Hilbert curve (from (0, 0) to (2^bits - 1, 0)) of the points (x, y) of a
    2^bits grid (int64 each)."""
    x, y = x.astype(np.int64).copy(), y.astype(np.int64).copy()
    d = np.zeros(len(x), np.int64)
    s = (1 << bits) >> 1
    while s > 0:
        rx = (x & s) > 0
        ry = (y & s) > 0
        d += s * s * ((3 * rx.astype(np.int64)) ^ ry.astype(np.int64))
        flip = ~ry & rx
        x = np.where(flip, s - 1 - x, x)  # the quadrant's own reflection (coordinates below s matter from here)
        y = np.where(flip, s - 1 - y, y)
        swap = ~ry
        x, y = np.where(swap, y, x), np.where(swap, x, y)
        x &= s - 1
        y &= s - 1
        s >>= 1
    return d


def moore_index(x: np.ndarray, y: np.ndarray, bits: int) -> np.ndarray:
    """Return the distance along a Moore curve (a closed Hilbert curve: its end neighbours its start) of the points
    (x, y) of a 2^bits grid: four Hilbert curves, up the left half and down the right."""
    h = 1 << (bits - 1)
    right, up = x >= h, y >= h
    quadrant = np.where(right, np.where(up, 2, 3), np.where(up, 1, 0)).astype(np.int64)
    lx, ly = x & (h - 1), y & (h - 1)
    # the left quadrants run a Hilbert curve turned a quarter left, the right ones a quarter right
    hx = np.where(right, h - 1 - ly, ly)
    hy = np.where(right, lx, h - 1 - lx)
    return quadrant * h * h + hilbert_index(hx, hy, bits - 1)


def _scaled(comm: Comm, parts: list[tuple[float, np.ndarray]]) -> np.ndarray:
    """Return a cost given as terms (coefficient, int64 per micro-batch) over its mean over all ranks (exact sums:
    the same at any rank count)."""
    m = comm.allreduce(len(parts[0][1]), "sum")
    mean = sum(c * comm.allreduce(exact_sum(v), "sum") for c, v in parts) / max(m, 1)
    cost = sum(c * v.astype(np.float64) for c, v in parts)
    return np.asarray(cost, np.float64) / mean if mean > 0 else np.zeros(len(parts[0][1]))


def two_cost_key(comm: Comm, a: list[tuple[float, np.ndarray]], b: list[tuple[float, np.ndarray]]) -> np.ndarray:
    """Return a key that orders micro-batches along a closed curve over two costs, each given as terms (collective).

    Each cost is taken relative to its mean and both on one grid (a step is the same share of
    either's mean, so a cell is as balanced in both); a Moore curve through the grid keeps any run
    of k micro-batches in a region of about sqrt(k/M) of it, for every k at once: at any world size
    a step's micro-batches are alike in both costs, and the plan's end neighbours its start (the
    short last step the reader fills from the start). 1M vision-language samples, W = 64: p99 of
    the steps' max/mean 1.033 (LLM) and 1.035 (encoder) (docs/multimodal.md); each cost scaled to
    its own range instead, about 1.06 for the LLM.
    """
    x, y = _scaled(comm, a), _scaled(comm, b)
    lo_x = comm.allreduce(float(x.min()) if len(x) else float("inf"), "min")
    lo_y = comm.allreduce(float(y.min()) if len(y) else float("inf"), "min")
    hi_x = comm.allreduce(float(x.max()) if len(x) else float("-inf"), "max")
    hi_y = comm.allreduce(float(y.max()) if len(y) else float("-inf"), "max")
    span = max(hi_x - lo_x, hi_y - lo_y)
    if not len(x) or not span > 0:
        return np.zeros(len(x), np.float64)
    top = (1 << CURVE_BITS) - 1
    gx = np.minimum(np.floor((x - lo_x) / span * top), top).astype(np.int64)
    gy = np.minimum(np.floor((y - lo_y) / span * top), top).astype(np.int64)
    return moore_index(gx, gy, CURVE_BITS).astype(np.float64)


def _stages(packed: Packed) -> np.ndarray:
    """Return each micro-batch's curriculum stage (int64; that of its first sample)."""
    mb = packed.batches
    if not len(mb.num_samples):
        return np.zeros(0, np.int64)
    return packed.stage[np.minimum(mb.offsets[:-1], max(len(packed.stage) - 1, 0))].astype(np.int64)


def global_order(comm: Comm, packed: Packed, key: np.ndarray) -> Packed:
    """Return this rank's part of all ranks' micro-batches sorted by (stage, ``key``, packed number).

    A distributed sort of one record per micro-batch (``sample_sort``), then each rank fetches the
    micro-batches of its sorted range from the ranks that packed them (their samples, rows and
    per-micro-batch arrays). The order is global, so the result does not depend on the rank count.
    """
    # a non-negative float64's bits order as the float does; 48 of them (relative precision 2^-36)
    # leave 16 for the stage above them
    return _order_by(comm, packed, (np.maximum(key.astype(np.float64), 0.0) + 0.0).view(np.uint64) >> np.uint64(16))


def _order_by(comm: Comm, packed: Packed, bits: np.ndarray) -> Packed:
    """Return this rank's part of all ranks' micro-batches sorted by (stage, ``bits`` < 2^48, packed number)."""
    m = len(packed.batches.num_samples)
    first = comm.exscan(m)
    hi = (_stages(packed).astype(np.uint64) << np.uint64(48)) | bits.astype(np.uint64)
    lo = (first + np.arange(m, dtype=np.int64)).astype(np.uint64)
    wanted = sample_sort(comm, hi, lo, {}).lo
    assert wanted is not None
    return fetch_microbatches(comm, packed, first, wanted.astype(np.int64))


def circle_order(comm: Comm, packed: Packed, cost: np.ndarray) -> Packed:
    """Return this rank's part of all micro-batches in a circle of their ``cost`` (``--balance``'s order, collective).

    Each stage's micro-batches are sorted by their cost and laid out as a circle: every
    other one ascending, then the rest descending, so neighbours are at most two places apart
    in the sorted order and the stage ends where it starts. The reader fills a short last step
    with micro-batches from the start of the plan: sorted plainly, that step would join the
    costliest with the cheapest (targets: max/mean 2 on 100k chats at W = 64). The order is
    global, so it does not depend on the rank count.
    """
    ordered = global_order(comm, packed, cost)
    stage = _stages(ordered)
    width = comm.allreduce(int(stage.max()) + 1 if len(stage) else 1, "max")
    count = comm.allreduce(np.bincount(stage, minlength=width).astype(np.int64), "sum")
    stage_start = np.concatenate(([0], np.cumsum(count)))[:-1]
    rank = comm.exscan(len(stage)) + np.arange(len(stage), dtype=np.int64) - stage_start[stage]
    # the j-th of a stage's n goes to place c of the circle (j even: j / 2; odd: n - 1 - j // 2), kept as
    # (c + 1/2) / n in 47 bits (the stage goes above them)
    circle = np.where(rank % 2 == 0, rank // 2, count[stage] - 1 - rank // 2)
    where = (2 * circle + 1) / np.maximum(2 * count[stage], 1)
    return _order_by(comm, ordered, np.floor(where * float(1 << 47)).astype(np.uint64))


def fetch_microbatches(comm: Comm, packed: Packed, first: int, wanted: np.ndarray) -> Packed:
    """Return the micro-batches of global numbers ``wanted`` (this rank packed ``[first, first + M)``), collective."""
    mb = packed.batches
    flat_first = comm.exscan(len(packed.sample_ids))
    per_mb = {"num_samples": mb.num_samples.astype(np.int64), "batch_size": mb.batch_size.astype(np.int64),
              "max_size": mb.max_size.astype(np.int64), "padded_size": np.asarray(mb.padded_size, np.int64),
              "tokens": mb.tokens.astype(np.int64), "flat": flat_first + mb.offsets[:-1]}
    rows = packed.row_sizes is not None
    if rows:
        assert packed.row_sizes is not None
        row_first = comm.exscan(len(packed.row_sizes))
        per_mb["row"] = row_first + np.concatenate(([0], np.cumsum(per_mb["batch_size"])))[:-1]
    got = fetch_rows(comm, per_mb, first, wanted)
    count = got["num_samples"]
    per_sample = {"sample_ids": packed.sample_ids, "keys": packed.keys, "stage": packed.stage}
    if packed.sizes is not None:
        per_sample["sizes"] = packed.sizes
    if packed.begin is not None and packed.end is not None:
        per_sample["begin"], per_sample["end"] = packed.begin, packed.end
    per_sample = with_measures(per_sample, packed.measures)
    flat = fetch_rows(comm, per_sample, flat_first, run_indices(got["flat"], count))
    row_sizes = None
    if rows:
        assert packed.row_sizes is not None
        wanted_rows = run_indices(got["row"], got["batch_size"])
        row_sizes = fetch_rows(comm, {"r": packed.row_sizes}, row_first, wanted_rows)["r"]
    offsets = np.concatenate(([0], np.cumsum(count))).astype(np.int64)
    batches = BatchArrays(offsets, count, got["batch_size"], got["max_size"], got["padded_size"], got["tokens"])
    return Packed(flat["sample_ids"], flat["keys"], flat["stage"], batches, packed.info, row_sizes,
                  flat.get("begin"), flat.get("end"), packed.shapes, flat.get("sizes"),
                  measures_in(flat))
