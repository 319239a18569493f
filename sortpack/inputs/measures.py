"""The per-sample measures: what a sample carries beside its size, one declaration each.

A measure is an int64 number per sample, by name. Every measure travels alike: its column in
the metrics and sorted directories, moved with its sample through the sort, the packing and the
mixture stages, summed per micro-batch into the index column of its name (the manifest's
``stats`` hold its total), and handed out by the reader (``MicroBatch.measures``, ``info()``).
A ``Measure`` declares what is a measure's own: what measures it (the SPEC of ``--size2`` or of
``--measure NAME=SPEC``, or the fine-tuning shape), how ``--oversize split``'s pieces count it,
and whether a sample without it has no content. Analyze, the split, the empty-sample filter,
the reader and ``inspect`` ask this table; a name it does not declare is a ``--measure`` whose
pieces take their share. Declaring a measure is adding its row.

Importing this module loads neither numpy nor pyarrow (``--help`` reads it).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import SortpackError

__all__ = ["MEASURES", "Measure", "measure_of", "parse_measure", "size_name"]


class Measure(NamedTuple):
    """One per-sample measure: its name, what measures it, how split pieces count it, whether it makes content."""

    name: str  # its column in every directory; the index sums it per micro-batch under the same name
    source: str = "--measure"  # what measures it: the option whose SPEC it is, or "the fine-tuning shape"
    # how --oversize split's pieces count it: "share" (in proportion to the units each holds, the shares summing
    # to the sample's exactly), "labels" (recounted from the labels analyze read, ``split.TargetPieces``); None: a
    # sample carrying it is never cut (a piece's share would be wrong: an image's patches stay whole)
    pieces: str | None = "share"
    trains: bool = False  # a sample with none of it trains nothing: dropped as empty (``fits.content_empty``)

    @property
    def option(self) -> str:
        """Return how a message names the option that measures it (``--size2``, ``--measure images``)."""
        return f"--measure {self.name}" if self.source == "--measure" else self.source


# the measures the package declares; any other name is a --measure NAME=SPEC with the defaults
MEASURES: dict[str, Measure] = {m.name: m for m in (
    Measure("size2", source="--size2", pieces=None),
    Measure("targets", source="the fine-tuning shape", pieces="labels", trains=True),
)}

# names a measure cannot take: the fixed columns of the three directory kinds (docs/format.md), and the keys of a
# manifest's stats and of inspect's report, beside which a measure's total is written under its name
RESERVED = frozenset((
    "sample_id", "size", "difficulty", "stage", "begin", "microbatch", "sample_ids", "num_samples", "batch_size",
    "max_size", "padded_size", "tokens", "min_key", "max_key", "row_splits", "source", "piece_begin", "piece_end",
    "attention", "num_microbatches", "num_rows", "num_shards", "padded_tokens", "padding_ratio", "fill",
    "distinct_shapes", "samples_per_microbatch", "size_sum", "size_min", "size_max", "difficulty_min",
    "difficulty_max", "stage_counts", "oversize", "skipped", "truncated", "skipped_tokens", "truncated_tokens",
    "truncated_targets", "split", "split_pieces", "split_tokens", "empty", "empty_dropped", "auto_shapes", "held",
    "held_out", "holdout", "shapes", "steps", "step_imbalance", "compute_imbalance", "targets_imbalance",
    "world_size", "grad_accum", "options", "format", "version", "kind", "directory", "content_hash", "warnings",
    "mixture", "sources", "cap_binding", "cap_fills", "cap_imbalance", "encoder_imbalance", "size2_imbalance",
    "cost_coeff"))
# the measures of the 2nd, 3rd.. --size2 SPEC: size3, size4, .. (declared as size2 is)
_MORE_SIZES = re.compile(r"size(?:[3-9]|[1-9][0-9]+)")


def size_name(k: int) -> str:
    """Return the measure of the k-th ``--size2`` SPEC (0-based): ``size2``, ``size3``, ..."""
    return f"size{k + 2}"


def measure_of(name: str) -> Measure:
    """Return the declaration of measure ``name`` (a ``--measure`` with the defaults when the table has none)."""
    declared = MEASURES.get(name)
    if declared is not None:
        return declared
    if _MORE_SIZES.fullmatch(name):  # a later --size2: its patches or frames stay whole, as size2's
        return Measure(name, source="--size2", pieces=None)
    return Measure(name)


def parse_measure(text: str) -> tuple[str, str]:
    """Return (name, SPEC) of a ``--measure NAME=SPEC`` (SortpackError, one line: a name it cannot take)."""
    name, sep, spec = text.partition("=")
    name, spec = name.strip(), spec.strip()
    if not sep or not name or not spec:
        raise SortpackError(f"--measure {text!r}: expected NAME=SPEC, e.g. images=column:num_images")
    if not name.isidentifier() or name in RESERVED:
        raise SortpackError(f"--measure {text!r}: {name!r} cannot name a measure (a plain identifier other than "
                            "the columns of a plan, docs/format.md)")
    declared = measure_of(name)
    if declared.source != "--measure":
        raise SortpackError(f"--measure {text!r}: {name} is measured by {declared.source}")
    return name, spec
