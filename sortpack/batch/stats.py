"""The figures of one planned batch (``BatchPlan.stats``): counts, the lower bound, fill, the ranks' imbalance."""
from __future__ import annotations

import numpy as np

from .items import Measures
from .options import BatchOptions


def _rank_sums(values: np.ndarray, layout: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Return each rank's sum of a per-sequence ``values`` (the plan's ``indices, offsets, firsts``)."""
    indices, offsets, firsts = layout
    cum = np.concatenate(([0], np.cumsum(values[indices])))
    at = offsets[firsts]
    return cum[at[1:]] - cum[at[:-1]]


def imbalance(sums: np.ndarray) -> float:
    """Return the largest of ``sums`` over their mean (1.0 when all are 0): the busiest rank's share of a step."""
    mean = float(np.mean(sums)) if len(sums) else 0.0
    return float(np.max(sums)) / mean if mean > 0 else 1.0


def plan_stats(m: Measures, opts: BatchOptions, layout: tuple[np.ndarray, np.ndarray, np.ndarray],
               rows: dict) -> dict:
    """Return the stats of a plan: ``layout`` its (indices, offsets, firsts), ``rows`` what packing made
    (``rows``: best fit's rows and the micro-batches set apart; ``alone``: those set apart)."""
    indices, offsets, firsts = layout
    lengths = m.lengths
    k = opts.pad_to_multiple
    room = -(-lengths // k) * k if k > 1 else lengths
    tokens, padded = int(lengths.sum()), int(room.sum())
    mbs = len(offsets) - 1
    bound = -(-padded // opts.max_tokens)
    if m.size2 is not None and m.cap2:
        bound = max(bound, -(-int(m.size2.sum()) // m.cap2))
    s = room.astype(np.float64)
    cum = np.concatenate(([0], np.cumsum(room[indices])))
    per_mb = cum[offsets[1:]] - cum[offsets[:-1]]
    targets = int(m.targets.sum()) if m.targets is not None else tokens - int(np.count_nonzero(lengths))
    balance = {"tokens": imbalance(_rank_sums(room, layout)),
               "cost": imbalance(_rank_sums(opts.coeff * s + s * s, layout))}
    if m.targets is not None:
        balance["targets"] = imbalance(_rank_sums(m.targets, layout))
    counts = np.diff(firsts)
    return {"samples": len(lengths), "tokens": tokens, "padded_tokens": padded, "targets": targets,
            "attention": int((lengths * lengths).sum()), "microbatches": mbs, "lower_bound": bound,
            "rows": rows["rows"], "split": mbs - rows["rows"], "alone": rows["alone"],
            "per_rank": {"min": int(counts.min()), "max": int(counts.max())},
            "fill": tokens / (mbs * opts.max_tokens) if mbs else 0.0,
            "largest": int(per_mb.max(initial=0)), "max_tokens": opts.max_tokens,
            "balance": opts.balanced, "cost_coeff": opts.coeff, "imbalance": balance}
