"""Numeric kernels: greedy packing and merging of sorted runs.

The public functions here are the contract the stages use. They run the compiled C
kernels (``_ckernels``, built by ``pip install``) when present and fall back to the
reference implementations below, which are correct but slow.
"""
from __future__ import annotations

import numpy as np

BUDGETS = ("padded", "tokens", "quadratic")


def round_lengths(lengths: np.ndarray, pad_multiple: int = 0, shapes: np.ndarray | None = None) -> np.ndarray:
    """Return lengths rounded up to a multiple of ``pad_multiple`` or to the next of ``shapes``.

    With ``shapes``, a length above the largest shape maps to -1 (an oversize sample).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if shapes is not None and len(shapes):
        shapes = np.asarray(shapes, dtype=np.int64)
        pos = np.searchsorted(shapes, lengths, side="left")
        out = np.full(lengths.shape, -1, dtype=np.int64)
        ok = pos < len(shapes)
        out[ok] = shapes[pos[ok]]
        return out
    if pad_multiple and pad_multiple > 1:
        return -(-lengths // pad_multiple) * pad_multiple
    return lengths.copy()


def sample_cost(lengths: np.ndarray, budget: str, quadratic_scale: float) -> np.ndarray:
    """Return each sample's cost under ``budget`` when alone in a micro-batch."""
    lengths = np.asarray(lengths, dtype=np.float64 if budget == "quadratic" else np.int64)
    if budget == "quadratic":
        return lengths + lengths * lengths / quadratic_scale
    return lengths


def greedy_pack_reference(sizes, max_tokens, budget="padded", max_samples=0, batch_multiple=1,
                          quadratic_scale=1.0, pad_multiple=0, shapes=None) -> np.ndarray:
    """Return micro-batch boundaries of the sequential greedy (the oracle; a Python loop).

    A sample joins the current micro-batch iff afterwards the budget holds and the count is
    at most ``max_samples`` (when > 0). Cost of a micro-batch of ``c`` samples whose largest
    rounded length is ``L``: padded ``c*L``; tokens ``sum(s)`` (``c*L`` when rounding);
    quadratic ``sum(s + s*s/Q)`` (``c*(L + L*L/Q)`` when rounding). When a micro-batch closes
    with ``batch_multiple`` M > 1, it keeps the largest multiple of M of its samples (all
    when fewer than M) and the rest open the next one, which the sample is tested against.
    Returns int64 ``[0, b1, ..., n]``: micro-batch i is ``sizes[b[i]:b[i+1]]``.
    """
    sizes = [int(s) for s in np.asarray(sizes, dtype=np.int64)]
    rounding = bool(pad_multiple and pad_multiple > 1) or (shapes is not None and len(shapes) > 0)
    shape_list = [int(x) for x in shapes] if shapes is not None else []

    def rnd(x):
        if shape_list:
            for s in shape_list:
                if s >= x:
                    return s
            return x
        if pad_multiple and pad_multiple > 1:
            return -(-x // pad_multiple) * pad_multiple
        return x

    def cost(batch):
        c = len(batch)
        if c == 0:
            return 0
        L = rnd(max(batch))
        if budget == "padded" or rounding:
            if budget == "quadratic":
                return c * (L + L * L / quadratic_scale)
            return c * L
        if budget == "tokens":
            return sum(batch)
        return sum(s + s * s / quadratic_scale for s in batch)

    bounds = [0]
    start = 0
    batch: list[int] = []
    for i, s in enumerate(sizes):
        while batch:
            trial = batch + [s]
            if cost(trial) <= max_tokens and (max_samples <= 0 or len(trial) <= max_samples):
                break
            c = len(batch)
            keep = c if c < batch_multiple else batch_multiple * (c // batch_multiple)
            start += keep
            bounds.append(start)
            batch = batch[keep:]
        batch.append(s)
    if batch:
        bounds.append(len(sizes))
    return np.asarray(bounds, dtype=np.int64)


def greedy_pack(sizes, max_tokens, budget="padded", max_samples=0, batch_multiple=1,
                quadratic_scale=1.0, pad_multiple=0, shapes=None) -> np.ndarray:
    """Return micro-batch boundaries of the sequential greedy (see ``greedy_pack_reference``)."""
    return greedy_pack_reference(sizes, max_tokens, budget, max_samples, batch_multiple,
                                 quadratic_scale, pad_multiple, shapes)


def merge_sorted_runs(keys: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (merged keys, permutation) of sorted uint64 runs ``keys[offsets[i]:offsets[i+1]]``.

    ``merged == keys[perm]``; equal keys keep run order.
    """
    perm = np.argsort(keys, kind="stable")
    return keys[perm], perm


def merge_sorted_runs2(hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Return the permutation merging runs sorted by the pair (hi, lo) of uint64 arrays."""
    return np.lexsort((lo, hi))
