"""The rows of one batch: the pack stage's best fit over its items, cut into windows as the offline plan cuts them.

The offline plan with ``--rows MAX_TOKENS`` sorts samples by (size, sample id), deals the k-th of
n sorted samples to window ``k mod ceil(n / 65536)`` (``partition.deal_windows``: each window spans
the whole size range) and packs each window with ``stages.pack.cut.window_plan``: best fit
decreasing, the two-cap greedy under a second cap, rows composed by their targets under
``balance="targets"``. One batch is one curriculum stage on one rank: the same windows, the same
function, so the same rows.
"""
from __future__ import annotations

import numpy as np

from ..kernels import DEFAULT_ROW_WINDOW
from ..stages.pack.balance import balance_of
from ..stages.pack.cut import window_plan
from ..stages.pack.options import PackOptions
from .items import Items
from .options import BatchOptions


def stable_order(keys: np.ndarray) -> np.ndarray:
    """Return the positions of non-negative ``keys`` in (key, position) order: a stable argsort, fast.

    Keys under 2^16 take numpy's radix sort (a tenth of a comparison sort's time on 100k keys);
    larger ones one plain sort of (key, position) packed into an int64, when they fit.
    """
    n = len(keys)
    top = int(keys.max()) if n else 0
    if top < 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    bits = max(n - 1, 1).bit_length()
    if top < (1 << (62 - bits)):
        return np.sort((keys.astype(np.int64) << bits) | np.arange(n, dtype=np.int64)) & ((1 << bits) - 1)
    return np.lexsort((np.arange(n), keys))


def pack_options(items: Items, opts: BatchOptions) -> PackOptions:
    """Return the pack stage's options of these rows: ``--rows MAX_TOKENS`` with the batch's caps."""
    return PackOptions(rows=opts.max_tokens, max_segments=opts.max_samples if items.count is None else 0,
                       max_size2=items.cap2, pad_to_multiple=opts.pad_to_multiple,
                       balance=opts.stage_mode, cost_coeff=opts.coeff)


def pack_items(items: Items, keep: np.ndarray, opts: BatchOptions) -> tuple[np.ndarray, np.ndarray]:
    """Return (the items row after row, the rows' splits) of the items ``keep`` (positions, each fits alone)."""
    order = keep[stable_order(items.size[keep])]  # the offline sort: (size, sample id)
    n = len(order)
    windows = -(-n // DEFAULT_ROW_WINDOW)
    popts = pack_options(items, opts)
    # as pack_rows: a balance that composes rows (targets) weighs each item; a second cap keeps best fit's rows
    # (the offline plan refuses the two together; here the deal still balances the targets)
    balance = balance_of(popts)
    weights = None
    if balance.composes_rows and items.size2 is None and items.targets is not None:
        weights = balance.weight(items.size, {"targets": items.targets})
    parts, splits = [], [np.zeros(1, np.int64)]
    done = 0
    for w in range(windows):
        at = order[w::windows]  # the k-th sorted item goes to window k mod windows, sorted order kept
        local, row_splits = window_plan(items.size[at], items.room[at],
                                        None if items.size2 is None else items.size2[at],
                                        None if weights is None else weights[at], popts)
        parts.append(at[local])
        splits.append(row_splits[1:] + done)
        done += len(at)
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return flat, np.concatenate(splits)
