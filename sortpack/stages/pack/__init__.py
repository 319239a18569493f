"""Stage 3: cut the sorted order into token-budgeted micro-batches.

Packing is greedy within fixed global pieces: segments of ``segment_size`` sorted samples
(2^20 by default), also cut where the curriculum stage changes. Ranks own whole segments,
so each packs its own with no communication, and the result does not depend on the rank
count; a dataset of one segment gives exactly the sequential greedy's micro-batches.
``--rows`` instead bin-packs best-fit windows into fixed-length rows.

From the bottom of the room up: what reads no options: ``budgets`` (the ``--budget``
registry), ``packed`` (the per-micro-batch records and the index's statistics), ``order`` (the
orders ``--balance`` lays micro-batches in) and ``balance`` (the ``--balance`` registry); then
``options`` (``PackOptions``, which asks the two registries), and what reads them: ``fits``
(oversize and empty samples), ``batches`` (the arrays of a cut), ``compose`` (rows composed by
their targets), ``cut`` (the greedy, best-fit rows, the order of two caps) and
``microbatches``, the entry (``pack_samples``, ``Microbatches``). The registries import no
numpy and take the options through a ``Protocol``.

The names below load with their modules, when first used: ``--help`` reads the registries
without loading numpy.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fits import OversizeError, refuse_oversize, static_batch_size, truncate_length
    from .microbatches import Microbatches, pack_samples
    from .options import SEGMENT_SIZE, PackOptions
    from .packed import microbatch_stats

# each public name -> the module of the room that defines it
_HOMES = {"SEGMENT_SIZE": "options", "PackOptions": "options", "Microbatches": "microbatches",
          "pack_samples": "microbatches", "OversizeError": "fits", "refuse_oversize": "fits",
          "static_batch_size": "fits", "truncate_length": "fits", "microbatch_stats": "packed"}

__all__ = ["SEGMENT_SIZE", "Microbatches", "OversizeError", "PackOptions", "microbatch_stats", "pack_samples",
           "refuse_oversize", "static_batch_size", "truncate_length"]


def __getattr__(name: str) -> Any:
    """Return the public name ``name`` from its module (PEP 562), loading it on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
