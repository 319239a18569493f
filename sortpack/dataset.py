"""Deprecated: ``sortpack.dataset`` was a third door to ``SourceDataset``; import it from ``sortpack.reader``.

The docs and examples of sortpack 0.1 taught ``from sortpack.dataset import SourceDataset``,
so scripts copied from them keep working: the name still resolves, with a
``DeprecationWarning`` naming the import to write (``sortpack.reader``, framework-free, or
``sortpack.torch`` beside the torch helpers). It goes in a later release.
"""
from __future__ import annotations

import warnings


def __getattr__(name: str):
    """Return ``SourceDataset`` from its home, warning that this import is deprecated."""
    if name == "SourceDataset":
        warnings.warn("sortpack.dataset is deprecated: write `from sortpack.reader import SourceDataset` "
                      "(or import it from sortpack.torch with the torch helpers)", DeprecationWarning, stacklevel=2)
        from .reader.dataset import SourceDataset

        return SourceDataset
    raise AttributeError(f"module 'sortpack.dataset' has no attribute {name!r}")
