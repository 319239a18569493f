"""Stage 3: cut the sorted order into token-budgeted micro-batches.

Packing is greedy within fixed global pieces: segments of ``segment_size`` sorted samples
(2^20 by default), also cut where the curriculum stage changes. Ranks own whole segments,
so each packs its own with no communication, and the result does not depend on the rank
count; a dataset of one segment gives exactly the sequential greedy's micro-batches.
``--rows`` instead bin-packs best-fit windows into fixed-length rows.

``options`` holds the options, ``budget`` what they let a sample or a length hold,
``filters`` the empty and oversize samples, ``greedy`` and ``rows`` the two packers,
``two_caps`` the order a second budget (``--max-size2``) packs in, ``batches`` the
per-micro-batch arrays they build, ``balance`` the order of micro-batches by cost
(``--balance``), ``stats`` the index summary and ``microbatches`` the stage's entry,
``pack_samples``.
"""
from __future__ import annotations

from .budget import static_batch_size, truncate_length
from .filters import OversizeError, refuse_oversize
from .microbatches import Microbatches, pack_samples
from .options import SEGMENT_SIZE, PackOptions
from .stats import microbatch_stats

__all__ = ["SEGMENT_SIZE", "Microbatches", "OversizeError", "PackOptions", "microbatch_stats", "pack_samples",
           "refuse_oversize", "static_batch_size", "truncate_length"]
