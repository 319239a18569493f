"""The packing-budget policy: what a sample and a micro-batch cost, and how limits compare.

A kernel cost (``KernelCost``) is two choices, the one table the greedy's numpy code and its
C code both read: whether a micro-batch costs its slots at the padded length (``c*unit(L)``,
``L`` its largest rounded length) or its samples one by one (``sum(unit(s))``), and whether a
unit is the length (``s``) or the length plus its attention (``s + s*s/Q``). ``COSTS`` names
the three the package's budgets use: ``padded`` (``c*L``), ``tokens`` (``sum(s)``) and
``quadratic`` (``sum(s + s*s/Q)``). Rounding (``--pad-to-multiple``, ``--shapes``) costs every
budget per slot. The greedy (``greedy.py``) and the capacity of a padded length
(``batch_capacity``) compare costs to the limit the same way.
"""
from __future__ import annotations

import math
import operator
import sys
from typing import Any, NamedTuple

import numpy as np

from ._loader import _i64


class KernelCost(NamedTuple):
    """How the kernels cost a micro-batch: per padded slot or per sample, each unit linear or quadratic."""

    per_slot: bool  # c * unit(L), L the largest (rounded) length; else the samples' units summed
    quadratic: bool  # unit(s) = s + s*s/Q (float); else s (exact int)

    @property
    def code(self) -> int:
        """Return the cost as the C kernel reads it: bit 0 per slot, bit 1 quadratic."""
        return int(self.per_slot) | int(self.quadratic) << 1


# the kernel costs by name (a budget names one, or gives a ``KernelCost`` of its own)
COSTS = {"padded": KernelCost(True, False), "tokens": KernelCost(False, False), "quadratic": KernelCost(False, True)}
BUDGETS = tuple(COSTS)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def kernel_cost(budget: str | KernelCost) -> KernelCost:
    """Return the ``KernelCost`` of a name in ``COSTS`` or of a (per_slot, quadratic) pair (ValueError otherwise)."""
    if isinstance(budget, str):
        if budget not in COSTS:
            raise ValueError(f"unknown budget {budget!r}; expected one of {', '.join(BUDGETS)}")
        return COSTS[budget]
    if not (isinstance(budget, tuple) and len(budget) == 2):
        raise ValueError(f"unknown budget {budget!r}; expected one of {', '.join(BUDGETS)} or a KernelCost")
    return KernelCost(bool(budget[0]), bool(budget[1]))


def round_lengths(lengths: np.ndarray, pad_multiple: int = 0, shapes: np.ndarray | None = None) -> np.ndarray:
    """Return lengths rounded up to a multiple of ``pad_multiple`` or to the next of ``shapes``.

    Parameters
    ----------
    lengths : array of int
        The sample lengths.
    pad_multiple : int
        Round up to a multiple of this when > 1 (ignored when ``shapes`` is given).
    shapes : array of int, optional
        Increasing allowed lengths; a length above the largest maps to -1 (an oversize sample).

    Returns
    -------
    numpy.ndarray
        int64 rounded lengths, a new array.
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


def sample_cost(lengths: np.ndarray, budget: str | KernelCost, quadratic_scale: float) -> np.ndarray:
    """Return each sample's cost under ``budget`` when alone in a micro-batch (its unit: per slot or not, alike).

    int64 for a linear cost (``padded``, ``tokens``), float64 (``s + s*s/Q``) for a quadratic one.
    """
    quadratic = kernel_cost(budget).quadratic
    lengths = np.asarray(lengths, dtype=np.float64 if quadratic else np.int64)
    if quadratic:
        return lengths + lengths * lengths / quadratic_scale
    return lengths


def limits(max_tokens: Any) -> tuple[int, float]:
    """Return (int limit, float limit) such that cost <= max_tokens exactly as Python compares.

    An int cost fits iff it is <= floor(max_tokens); a float cost iff it is <= the largest
    double not above max_tokens (Python compares int and float exactly, without rounding).
    """
    if isinstance(max_tokens, (float, np.floating)):
        d = float(max_tokens)
        if math.isnan(d):
            return _INT64_MIN, d
        li = _INT64_MAX if d >= 2.0**63 else _INT64_MIN if d < -(2.0**63) else math.floor(d)
        return li, d
    m = operator.index(max_tokens)
    li = min(max(m, _INT64_MIN), _INT64_MAX)
    try:
        d = float(m)
    except OverflowError:
        return li, (sys.float_info.max if m > 0 else -math.inf)
    if d > m:
        d = math.nextafter(d, -math.inf)
    return li, d


def batch_capacity(lengths: Any, max_tokens: Any, budget: str | KernelCost = "padded", quadratic_scale: float = 1.0,
                   max_samples: int = 0) -> np.ndarray:
    """Return, per padded length L, the most samples a micro-batch rounded to L can hold.

    Compares exactly as ``greedy_pack`` does when lengths are rounded (cost ``c*L``, or
    ``c*(L + L*L/Q)`` for a quadratic cost), capped at ``max_samples`` when > 0, so a
    micro-batch the greedy packs at length L never holds more.

    Parameters
    ----------
    lengths : array of int
        Padded lengths, positive (ValueError otherwise).
    max_tokens : int or float
        The budget's limit on a micro-batch's cost.
    budget : str or KernelCost
        One of ``BUDGETS``, or a ``KernelCost``.
    quadratic_scale : float
        ``Q`` of a quadratic cost.
    max_samples : int
        Cap on the count when > 0.

    Returns
    -------
    numpy.ndarray
        int64 capacities, 0 where L alone does not fit.
    """
    quadratic = kernel_cost(budget).quadratic
    lengths = _i64(lengths)
    if len(lengths) and lengths.min() < 1:
        raise ValueError("lengths must be positive")
    lim_i, lim_d = limits(max_tokens)
    if quadratic:
        # the kernel's float expression, so that c fits here iff it fits there
        unit = lengths.astype(np.float64) + (lengths * lengths).astype(np.float64) / float(quadratic_scale)
        cap = np.floor(lim_d / unit).astype(np.int64)
        for _ in range(4):  # the float quotient may be off by one either way
            cap += ((cap + 1).astype(np.float64) * unit <= lim_d)
            cap -= ((cap > 0) & (cap.astype(np.float64) * unit > lim_d))
    else:
        cap = np.maximum(lim_i, 0) // lengths
    if max_samples and max_samples > 0:
        cap = np.minimum(cap, max_samples)
    return np.maximum(cap, 0)
