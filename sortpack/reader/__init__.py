"""Train-time reader, public face: open an index, plan steps for every rank, read its samples.

The framework-free door (numpy and pyarrow, no torch, no MPI); ``sortpack.torch`` is the
other one, for ``DataLoader`` and the torch helpers. See docs/reader.md.
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
           "SourceDataset",
           "StepFacts",
           "check_group_alignment",
           "lr_scale",
           "step_info",
           "step_positions",
]


def __getattr__(name: str):
    """Return ``SourceDataset``, imported on first use (its input readers cost a tenth of a second to load)."""
    if name == "SourceDataset":
        from .dataset import SourceDataset

        globals()["SourceDataset"] = SourceDataset  # found directly from now on
        return SourceDataset
    raise AttributeError(f"module 'sortpack.reader' has no attribute {name!r}")
