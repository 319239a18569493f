"""torch side of the reader, public face: ``PackedBatchSampler``, ``PlanLoader``, ``VariableBatchSizeLR``, collate.

The implementation lives in ``sortpack.train`` (``sampler``, ``lr``, ``collate``); torch is
imported only where it is used, so importing this module is cheap and works without torch.

This file is named ``torch.py``: when the ``sortpack/`` directory itself is on ``sys.path``
(``python sortpack/some_script.py``), ``import torch`` would find it instead of PyTorch.
Loaded that way (as the top-level module ``torch``), it hands ``import torch`` the real
PyTorch, so no ``import torch`` anywhere ever gets this file.
"""
from __future__ import annotations

if __name__ == "torch":  # loaded as top-level ``torch`` because sortpack/ is on sys.path
    import importlib as _importlib
    import os as _os
    import sys as _sys

    _here = _os.path.dirname(_os.path.abspath(__file__))
    _saved = list(_sys.path)
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or _os.getcwd()) != _here]
    del _sys.modules["torch"]
    try:
        _real = _importlib.import_module("torch")
    finally:
        _sys.path[:] = _saved
    # the import system returns sys.modules["torch"]: the real package
    _sys.modules["torch"] = _real
else:
    from .train.collate import (
        PackedDataset,
        PadCollate,
        VarlenCollate,
        hf_inputs,
        pad_collate,
        varlen_collate,
    )
    from .train.goodput_controller import GoodputController
    from .train.index import PackedIndex
    from .train.loader import PlanLoader
    from .train.loss import step_loss, step_targets
    from .train.lr import LR_METHODS, VariableBatchSizeLR
    from .train.sampler import (
        MicroBatch,
        PackedBatchSampler,
        PackedSampler,
        Samples,
        _world,
    )

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
    _PUBLIC_BEFORE = (LR_METHODS, PackedSampler, Samples, _world)  # importable as before the split
