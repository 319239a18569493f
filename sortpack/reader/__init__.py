"""Train-time reader, public face: open an index, plan steps for every rank, scale the learning rate.

Depends on numpy and pyarrow only (no torch, no MPI). ``sortpack.torch`` wraps it for
``DataLoader``. See docs/reader.md.
"""
from __future__ import annotations

from ..permutation import KeyedPermutation
from .index import SCALAR_COLUMNS, PackedIndex
from .lr import LR_METHODS, lr_scale
from .microbatch import MicroBatch, Samples, StepFacts, step_info
from .plan import ORDERS, EpochPlan, check_group_alignment, step_positions
from .prefetch import Prefetched, Prefetcher
from .sampler import PackedSampler

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
           "StepFacts",
           "check_group_alignment",
           "lr_scale",
           "step_info",
           "step_positions",
]
