"""torch side of the reader, public face: ``PackedBatchSampler``, ``PlanLoader``, ``VariableBatchSizeLR``, collate.

The implementation lives in ``sortpack.reader.torch``; torch is
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
    from .reader.torch import *  # noqa: F403
    from .reader.torch import __all__  # noqa: F401
