"""torch side of the reader: ``PackedBatchSampler``, ``VariableBatchSizeLR``, collate helpers.

torch is imported only where it is used, so importing this module is cheap and works without torch.
"""
from __future__ import annotations

from .collate import (
    PackedDataset,
    PadCollate,
    VarlenCollate,
    hf_inputs,
    pad_collate,
    varlen_collate,
)
from .goodput_controller import GoodputController
from .index import PackedIndex
from .loader import PlanLoader
from .loss import step_loss, step_targets
from .lr import VariableBatchSizeLR
from .microbatch import MicroBatch
from .sampler import PackedBatchSampler

__all__ = [
    "GoodputController",
    "MicroBatch",
    "PackedBatchSampler",
    "PackedDataset",
    "PackedIndex",
    "PadCollate",
    "PlanLoader",
    "VariableBatchSizeLR",
    "VarlenCollate",
    "hf_inputs",
    "pad_collate",
    "step_loss",
    "step_targets",
    "varlen_collate",
]
