"""The torch door: what a PyTorch training loop imports from sortpack.

Reading (``PackedBatchSampler``, ``PlanLoader``, ``SourceDataset``, the collate helpers) comes
from ``sortpack.reader``; the training-loop helpers (``VariableBatchSizeLR``, ``step_loss``,
``GoodputController``) from ``sortpack.train``. torch is imported only where it is used, so
importing this module is cheap and works without torch.

This file is named ``torch.py``: when the ``sortpack/`` directory itself is on ``sys.path``
(``python sortpack/some_script.py``), ``import torch`` would find it instead of PyTorch.
Loaded that way (as the top-level module ``torch``), it hands ``import torch`` the real
PyTorch, so no ``import torch`` anywhere ever gets this file.
"""
from __future__ import annotations

if __name__ == "torch":  # loaded as top-level ``torch`` because sortpack/ is on sys.path
    from shadowing import hand_over  # a sibling, top-level here too

    hand_over(__name__, __file__)
else:
    from .reader.collate import (
        PackedDataset,
        PadCollate,
        VarlenCollate,
        block_mask,
        hf_inputs,
        pad_collate,
        varlen_collate,
    )
    from .reader.dataset import SourceDataset
    from .reader.index import PackedIndex
    from .reader.loader import PlanLoader
    from .reader.microbatch import MicroBatch
    from .reader.sampler import PackedBatchSampler
    from .train.goodput_controller import GoodputController
    from .train.loss import step_loss, step_targets
    from .train.lr import VariableBatchSizeLR

    __all__ = [
        "GoodputController",
        "MicroBatch",
        "PackedBatchSampler",
        "PackedDataset",
        "PackedIndex",
        "PadCollate",
        "PlanLoader",
        "PlanNode",  # noqa: F822 - the module's __getattr__ imports it on first use
        "SourceDataset",
        "VariableBatchSizeLR",
        "VarlenCollate",
        "block_mask",
        "hf_inputs",
        "pad_collate",
        "step_loss",
        "step_targets",
        "varlen_collate",
    ]


def __getattr__(name: str):
    """Return ``PlanNode``, imported on first use (it imports torchdata, and torchdata imports torch)."""
    if name == "PlanNode":
        from .plan_node import PlanNode

        globals()["PlanNode"] = PlanNode
        return PlanNode
    raise AttributeError(f"module 'sortpack.torch' has no attribute {name!r}")
