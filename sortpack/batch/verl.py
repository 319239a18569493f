"""verl's two entry points with their signatures, planned by ``plan_batch``: ``get_seqlen_balanced_partitions``
(a batch split into k parts of balanced length) and ``rearrange_micro_batches`` (a rank's batch cut into
micro-batches of at most ``max_token_len`` tokens, the same count on every data-parallel rank).

Drop-in: ``from sortpack.batch.verl import rearrange_micro_batches``. Unlike a Karmarkar-Karp
split into ``ceil(total / max_token_len)`` parts, no micro-batch is ever over the cap and no
Karmarkar-Karp pass is repeated with one more part until none is: the pack stage's best fit makes
the micro-batches, and the deal balances them.
"""
from __future__ import annotations

import numbers
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SortpackError
from .deal import deal_rows
from .plan import plan_batch

# verl's ``calculate_workload``: 24576 * s + s^2 (a 7B model, hidden size 4096)
VERL_COST_COEFF = 24576.0


def get_seqlen_balanced_partitions(seqlen_list, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Return ``k_partitions`` lists of indices into ``seqlen_list`` (each ascending, none empty), their sums balanced.

    ``equal_size``: every part holds ``len(seqlen_list) / k_partitions`` items (which must divide);
    otherwise only the sums are balanced, as verl's (any counts, none empty). The parts are
    Karmarkar-Karp's with equal counts, then improved by swaps (``sortpack.batch.deal``),
    compiled; without ``equal_size``, those of Karmarkar-Karp with free counts (verl's) where
    their heaviest part is lighter.
    """
    values = _values(seqlen_list)
    if isinstance(k_partitions, bool) or not isinstance(k_partitions, numbers.Integral) or k_partitions < 1:
        raise SortpackError(f"get_seqlen_balanced_partitions: k_partitions={k_partitions!r}: expected an integer >= 1")
    n = len(values)
    if k_partitions < 1 or n < k_partitions:
        raise SortpackError(f"get_seqlen_balanced_partitions: {n} items cannot fill {k_partitions} partitions")
    if equal_size and n % k_partitions:
        raise SortpackError(f"get_seqlen_balanced_partitions: equal_size needs {n} items to divide by {k_partitions}")
    part = deal_rows(values, k_partitions)
    if not equal_size:
        free = _free_counts(values, k_partitions)
        heaviest = [np.bincount(p, values, minlength=k_partitions).max() for p in (part, free)]
        part = free if heaviest[1] < heaviest[0] else part
    order = np.lexsort((np.arange(n), part))
    return [chunk.tolist() for chunk in np.split(order, np.cumsum(np.bincount(part, minlength=k_partitions))[:-1])]


def _values(seqlen_list) -> np.ndarray:
    """Return ``seqlen_list`` as 1-d float64 (SortpackError naming the first value that is not a finite number)."""
    try:
        values = np.asarray(seqlen_list, dtype=np.float64)
    except (TypeError, ValueError):
        raise SortpackError("get_seqlen_balanced_partitions: seqlen_list must hold numbers") from None
    if values.ndim != 1:
        raise SortpackError(f"get_seqlen_balanced_partitions: seqlen_list must be 1-d, got shape {values.shape}")
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise SortpackError(f"get_seqlen_balanced_partitions: seqlen_list[{int(bad[0])}] = {values[bad[0]].item()!r}: "
                            "expected a finite number")
    return values


def _free_counts(values: np.ndarray, k: int) -> np.ndarray:
    """Return each item's part (0..k-1, none empty) by Karmarkar-Karp with free counts, as verl's ``equal_size=False``.

    Each item is a state of k parts, itself in one; the state of largest spread (heaviest part
    less lightest; ties: the earlier) takes the next, its i-th heaviest part the other's i-th
    lightest, until one is left. A part left empty (items of 0) takes the lightest item of the
    part of most items, which raises no part over the heaviest.
    """
    from ..kernels.deal import differencing

    n = len(values)
    order = np.lexsort((np.arange(n), values))
    sums = np.zeros((n, k))
    sums[:, 0] = values[order]  # each item a state of k parts, itself in the first
    part = np.empty(n, np.int64)
    part[order] = differencing(sums)[np.arange(n) * k]
    for empty in np.flatnonzero(np.bincount(part, minlength=k) == 0):
        donor = int(np.argmax(np.bincount(part, minlength=k)))
        held = np.flatnonzero(part == donor)
        part[held[np.lexsort((held, values[held]))[0]]] = empty
    return part


def _seq_lengths(batch) -> np.ndarray:
    """Return each sample's tokens: ``attention_mask`` summed, or a nested ``input_ids``' lengths (verl's rule)."""
    ids = batch["input_ids"]
    if getattr(ids, "is_nested", False):
        return np.asarray(ids.offsets().diff().cpu(), dtype=np.int64)
    mask = batch["attention_mask"]
    mask = mask.cpu() if hasattr(mask, "cpu") else mask
    return np.asarray(mask, dtype=np.int64).sum(axis=-1)


def _select(batch, idx: list[int]):
    """Return the samples ``idx`` of ``batch``: each value of a mapping indexed, else ``batch[idx]`` (TensorDict)."""
    if isinstance(batch, Mapping):
        return {k: v[idx] for k, v in batch.items()}
    return batch[idx]


def _forced_groups(n: int, size: int) -> np.ndarray | None:
    """Return each sample's group of ``size`` consecutive samples (None for 1), verl's ``force_group_size``."""
    if size < 1 or n % size:
        raise SortpackError(f"rearrange_micro_batches: batch size {n} must divide by force_group_size {size}")
    return np.arange(n) // size if size > 1 else None


def _over_cap(lengths: np.ndarray, max_token_len, size: int) -> str | None:
    """Return why a sample (forced group) is over ``max_token_len``, in this adapter's terms (None: none is); raise
    SortpackError for a ``max_token_len`` that is not an integer >= 1. plan_batch's message names ``max_tokens`` and
    ``oversize``, keywords verl has not; the caller raises it once every rank knows (``_agreed_count``)."""
    if isinstance(max_token_len, bool) or not isinstance(max_token_len, numbers.Integral) or max_token_len < 1:
        raise SortpackError(f"rearrange_micro_batches: max_token_len={max_token_len!r}: expected an integer >= 1")
    sums = lengths.reshape(-1, size).sum(axis=1) if size > 1 else lengths
    over = np.flatnonzero(sums > max_token_len)
    if not len(over):
        return None
    what = f"sample {int(over[0])}" if size == 1 else \
        f"the forced group of samples {int(over[0]) * size}..{int(over[0]) * size + size - 1}"
    return (f"rearrange_micro_batches: {what} holds {int(sums[over[0]])} tokens, over "
            f"max_token_len={int(max_token_len)} ({len(over)} over it in all); raise max_token_len"
            f"{'' if size == 1 else ' or lower force_group_size'}")


def _agreed_count(count: int, units: int, dp_group, same: bool, over: str | None) -> int:
    """Return the most micro-batches any data-parallel rank needs (one all-reduce over ``dp_group``, the default
    group when None, as verl's; ``count`` without torch.distributed initialised or without ``same``).

    Every rank raises together when one has fewer samples (groups) than that count, or a sample over
    the cap (``over``: why, on that rank): a rank that raised alone would leave the others waiting in
    this all-reduce or their next collective.
    """
    if not same or "torch.distributed" not in sys.modules:
        return _alone(count, over)  # one rank's plan: torch is not even imported
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return _alone(count, over)

    device = "cuda" if dist.get_backend(dp_group) == "nccl" else "cpu"
    agreed = torch.tensor([count, -units, over is not None], dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=dp_group)
    if int(agreed[2].item()):
        raise SortpackError(over or "rearrange_micro_batches: another data-parallel rank holds a sample over "
                                    "max_token_len (its own error names it)")
    most, fewest = int(agreed[0].item()), -int(agreed[1].item())
    if most > fewest:
        raise SortpackError(f"rearrange_micro_batches: a data-parallel rank has {fewest} samples (or forced groups), "
                            f"fewer than the {most} micro-batches another rank needs: none may be empty")
    return most


def _alone(count: int, over: str | None) -> int:
    """Return ``count`` where this rank plans alone, raising its over-cap error first."""
    if over is not None:
        raise SortpackError(over)
    return count


def rearrange_micro_batches(batch, max_token_len: int, dp_group=None, num_batches_divided_by: int | None = None,
                            same_micro_num_in_dp: bool = True, min_num_micro_batch: int | None = None,
                            use_dynamic_bsz_balance: bool = True, force_group_size: int = 1):
    """Return (micro-batches, their index lists) of a rank's ``batch``, as verl's ``rearrange_micro_batches``.

    Each micro-batch holds at most ``max_token_len`` tokens (``attention_mask`` summed per
    sample); with ``same_micro_num_in_dp`` under torch.distributed every rank of ``dp_group`` (the
    default group when None, as in verl) gets the same count (the most any needs, one
    all-reduce), a multiple of ``num_batches_divided_by`` and at least ``min_num_micro_batch``;
    ``force_group_size`` consecutive samples stay together. With ``use_dynamic_bsz_balance`` the
    micro-batches are ordered by workload (``24576*s + s^2``), the lightest at both ends, as verl
    orders them for pipeline warm-up and cool-down.
    """
    lengths = _seq_lengths(batch)
    groups = _forced_groups(len(lengths), force_group_size)
    over = _over_cap(lengths, max_token_len, force_group_size)
    kw: dict[str, Any] = {"world_size": 1, "max_tokens": int(max_token_len), "cost_coeff": VERL_COST_COEFF,
                          "groups": groups,
                          "count_multiple": int(num_batches_divided_by or 1),
                          "min_microbatches": int(min_num_micro_batch or 0)}
    plan = plan_batch(lengths, **kw) if over is None else None
    units = len(lengths) // force_group_size
    most = _agreed_count(0 if plan is None else plan.num_microbatches, units, dp_group, same_micro_num_in_dp, over)
    assert plan is not None  # an over-cap sample raised on every rank above
    if most > plan.num_microbatches:
        plan = plan_batch(lengths, **{**kw, "min_microbatches": most})
    parts = [mb.tolist() for mb in plan.rank(0)]  # costliest first
    if use_dynamic_bsz_balance:
        parts = parts[::2][::-1] + parts[1::2]  # the lightest at both ends
    return [_select(batch, p) for p in parts], parts
