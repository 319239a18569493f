"""The mixture stage: a union of sources analyzed and sorted as one, packed, blended and moved to its writers.

``pipeline.mixture`` strings these together (docs/mixtures.md). The pure halves work on
numpy arrays and take ``rank=``/``size=`` where a rank's share matters, so they are tested
without MPI (tests/stages/mixture/); the communicating halves gather a few numbers per
micro-batch (never per sample) or move one Alltoallv of sample ids.

- ``union``: the sources analyzed as one input, or apart and numbered contiguously per rank
  for the one sort (``analyze_union`` -> ``Union``: the samples, each one's source, and the
  ``Sources`` layout: first ids, files, the segment table that ``global_ids`` maps back with);
  cut (``split_union``) and held out (``holdout_plan``) by source.
- ``packing``: how the mixture packs (``MixturePacking``) and every rank's packed units
  (``gather_packed`` -> ``PackedUnits``).
- ``part_pass``: the sources' uses past their whole passes, a seeded subset of samples
  (``choose_part_passes``), packed after the whole packing (``pack_part_passes``).
- ``blend``: the pure interleave of the units into the plan order (``plan_blend``, WF2Q).
- ``plan``: the units blended (``blend_units``), the plan's micro-batches moved to the ranks
  that write their index shards (``move_to_writers``) and the manifest's ``mixture`` record
  (``mixture_record``); ``blend_mixture`` does the three.
"""
from __future__ import annotations

from .packing import MixturePacking, PackedUnits, concat_microbatches, gather_packed, held_tokens, take_runs
from .part_pass import choose_part_passes, pack_part_passes
from .plan import (
    Blended,
    IndexShards,
    blend_mixture,
    blend_units,
    mixture_record,
    move_plan,
    move_to_writers,
    plan_order,
    split_source,
)
from .union import (
    ReadWith,
    Sources,
    Union,
    analyze_union,
    global_ids,
    holdout_plan,
    own_column,
    piece_sources,
    segment_table,
    source_bases,
    source_of,
    split_union,
    union_segments,
    union_sources,
)

__all__ = ["Blended", "IndexShards", "MixturePacking", "PackedUnits", "ReadWith", "Sources", "Union",
           "analyze_union", "blend_mixture", "blend_units", "choose_part_passes", "concat_microbatches",
           "gather_packed", "global_ids", "held_tokens", "holdout_plan", "mixture_record", "move_plan",
           "move_to_writers", "own_column", "pack_part_passes", "piece_sources", "plan_order", "segment_table",
           "source_bases", "source_of", "split_source", "split_union", "take_runs", "union_segments",
           "union_sources"]
