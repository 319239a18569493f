"""Hand an import over to the real package when a sortpack module named like it (``torch.py``, ``lightning.py``)
was found instead.

With the ``sortpack/`` directory itself on ``sys.path`` (``python sortpack/some_script.py``),
``import torch`` finds ``sortpack/torch.py`` as the top-level module ``torch``. Such a module
calls ``hand_over`` first thing: the real package is imported with that directory left out
of the path and put in ``sys.modules``, which is what the import statement then returns.
It is loaded as the top-level ``shadowing`` in that case (its siblings are top-level modules
there), so it imports nothing of sortpack.
"""
from __future__ import annotations

import importlib
import os
import sys


def hand_over(name: str, file: str) -> None:
    """Put the real package ``name`` in ``sys.modules`` in place of the sortpack module ``file`` loaded under it."""
    here = os.path.dirname(os.path.abspath(file))
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    del sys.modules[name]
    try:
        real = importlib.import_module(name)
    finally:
        sys.path[:] = saved
    # the import system returns sys.modules[name]: the real package
    sys.modules[name] = real
