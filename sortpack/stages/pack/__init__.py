"""Stage 3: cut the sorted order into token-budgeted micro-batches.

Packing is greedy within fixed global pieces: segments of ``segment_size`` sorted samples
(2^20 by default), also cut where the curriculum stage changes. Ranks own whole segments,
so each packs its own with no communication, and the result does not depend on the rank
count; a dataset of one segment gives exactly the sequential greedy's micro-batches.
``--rows`` instead bin-packs best-fit windows into fixed-length rows.

``fits`` says what fits (the ``--budget`` registry, oversize and empty samples), ``cut`` how
to cut (the greedy, best-fit rows, the order of two caps), ``microbatches`` is the entry (the
options, ``pack_samples``, ``Microbatches``); ``packed`` holds the per-micro-batch arrays the
cut builds and ``balance`` reorders (``--balance``), and the index's statistics.
"""
from __future__ import annotations

from .fits import OversizeError, refuse_oversize, static_batch_size, truncate_length
from .microbatches import SEGMENT_SIZE, Microbatches, PackOptions, pack_samples
from .packed import microbatch_stats

__all__ = ["SEGMENT_SIZE", "Microbatches", "OversizeError", "PackOptions", "microbatch_stats", "pack_samples",
           "refuse_oversize", "static_batch_size", "truncate_length"]
