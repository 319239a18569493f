"""The learning-rate multiplier of a step, from its batch size: what the plan says each step's LR scale is.

The torch scheduler that applies it during training is ``sortpack.train.lr.VariableBatchSizeLR``.
"""
from __future__ import annotations

import math

LR_METHODS = ("linear", "sqrt", "none")


def lr_scale(step_batch: float, ref_batch_size: float, method: str = "linear") -> float:
    """Return the LR multiplier for a step of ``step_batch``: k, sqrt(k) or 1 with k = batch/ref.

    Examples
    --------
    Budget 30 tokens, reference batch 2: micro-batches of 10 and 4 samples.

    >>> from sortpack.reader import lr_scale
    >>> lr_scale(10, 2), lr_scale(4, 2)
    (5.0, 2.0)
    >>> lr_scale(8, 2, "sqrt"), lr_scale(8, 2, "none")
    (2.0, 1.0)
    """
    if method not in LR_METHODS:
        raise ValueError(f"method must be one of {', '.join(LR_METHODS)}, not {method!r}")
    if ref_batch_size <= 0:
        raise ValueError("ref_batch_size must be positive")
    k = float(step_batch) / float(ref_batch_size)
    return k if method == "linear" else math.sqrt(k) if method == "sqrt" else 1.0

