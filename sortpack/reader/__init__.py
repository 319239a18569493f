"""Train-time reader, public face: open an index, plan steps for every rank, scale the learning rate.

Depends on numpy and pyarrow only (no torch, no MPI). The implementation lives in
``sortpack.reader`` (``index``, ``permutation``, ``plan``, ``sampler``, ``lr``); every name
importable from here before that split still is. ``sortpack.torch`` wraps it for
``DataLoader``. See docs/reader.md.
"""
from __future__ import annotations

from ..permutation import _M64, KeyedPermutation, _mix, _mix_vec
from .index import SCALAR_COLUMNS, PackedIndex
from .index import SCALAR_COLUMNS as _SCALAR_COLUMNS
from .lr import LR_METHODS, lr_scale
from .plan import ORDERS, EpochPlan, check_group_alignment, step_positions
from .prefetch import Prefetched, Prefetcher
from .sampler import MicroBatch, PackedSampler, Samples, step_info

__all__ = [
           "LR_METHODS",
           "ORDERS",
           "SCALAR_COLUMNS",
           "EpochPlan",
           "KeyedPermutation",
           "MicroBatch",
           "PackedIndex",
           "PackedSampler",
           "Prefetched",
           "Prefetcher",
           "Samples",
           "check_group_alignment",
           "lr_scale",
           "step_info",
           "step_positions",
]
_PRIVATE = (_SCALAR_COLUMNS, _M64, _mix, _mix_vec)  # importable as before the split
