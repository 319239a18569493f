"""The samples that enter packing: empty ones dropped, oversize ones refused, skipped or truncated."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...distribute import global_start
from ...errors import SortpackError
from ...parallel import Comm
from ..samples import SampleColumns, exact_sum
from .budget import oversize_mask, oversize_reason, truncate_length
from .options import PackOptions


class OversizeError(SortpackError):
    """Samples larger than the budget under ``--oversize error`` (``run`` adds how to keep its analysis)."""


def content_empty(samples: SampleColumns, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Return which samples (of ``lo:hi``) have no content: a size no larger than what an empty sample measures,
    or no loss target.

    Under ``--size tokens`` with special tokens an empty text measures the tokens the
    post-processor adds (``[CLS] [SEP]``: 2), which analyze records as ``empty_size``; a
    text of whitespace only measures the same and holds no token either. Every other size
    kind measures an empty sample as 0.
    """
    empty = samples.size[lo:hi] <= samples.empty_size
    if samples.begin is not None:
        empty &= samples.begin[lo:hi] == 0  # a document's last piece may hold just [SEP]: it is content all the same
    targets = samples.measures.get("targets")
    if targets is not None:
        # fine-tuning data: a sample (or piece) without a loss target trains nothing (an empty completion,
        # a chat without an assistant turn, a piece of prompt only)
        empty |= targets[lo:hi] <= 0
    return empty


def drop_empty(comm: Comm, samples: SampleColumns, opts: PackOptions) -> tuple[SampleColumns, int]:
    """Return the samples without content-empty ones (unless ``keep_empty``) and how many there were over all ranks.

    An empty sample has no token to train on: alone or together, empty samples make
    micro-batches of pure padding (or of special tokens only). The rest keep their order
    and sample ids; positions close up globally, so the packing does not depend on the
    rank count.
    """
    empty = content_empty(samples)
    count = comm.allreduce(int(empty.sum()), "sum")
    if count == 0 or opts.keep_empty:
        return samples, count
    keep = ~empty
    start, total = global_start(comm, int(keep.sum()))
    return samples.select(keep, start, total), count


def refuse_oversize(comm: Comm, samples: SampleColumns, opts: PackOptions) -> None:
    """Raise OversizeError (on every rank) when a sample does not fit alone under ``--oversize error``.

    ``run`` calls it right after analyze, before the sort, so a plan that cannot be packed
    fails in seconds rather than after the sort (pack calls it again through ``apply_oversize``).
    """
    if opts.max_size2 and "size2" not in samples.measures:  # the same options and columns on every rank
        raise SortpackError("--max-size2 N caps the second size: give --size2 SPEC (at analyze or run)",
                            collective=True)
    if opts.oversize != "error":
        return
    size2 = samples.measures.get("size2")
    if opts.max_size2 and size2 is not None:
        over2 = size2 > opts.max_size2
        count = comm.allreduce(int(over2.sum()), "sum")
        if count:
            largest = comm.allreduce(int(size2[over2].max()) if over2.any() else 0, "max")
            raise OversizeError(f"{count} samples have a second size over --max-size2 {opts.max_size2} alone "
                                f"(largest {largest}); raise --max-size2 or use --oversize skip", collective=True)
    over = oversize_mask(opts, samples.size)
    count = comm.allreduce(int(over.sum()), "sum")
    if count:
        largest = comm.allreduce(int(samples.size[over].max()) if over.any() else 0, "max")
        ways = ("--oversize skip (a second size cannot be cut)" if "size2" in samples.measures else
                "--oversize split (cut them into pieces that fit, no token lost), skip or truncate")
        raise OversizeError(f"{count} samples {oversize_reason(opts, largest)}, or use {ways}", collective=True)


def apply_oversize(comm: Comm, samples: SampleColumns, opts: PackOptions) -> tuple[SampleColumns, dict]:
    """Return the samples after the ``--oversize`` policy, and counts of what it did (over all ranks)."""
    refuse_oversize(comm, samples, opts)
    over = oversize_mask(opts, samples.size, samples.measures.get("size2"))
    count = comm.allreduce(int(over.sum()), "sum")
    info = {"oversize": count, "skipped": 0, "truncated": 0}
    if count == 0:
        return samples, info
    if opts.oversize == "split":
        # split happens before the sort (stages.split): nothing here may still be too large
        raise SortpackError(f"{count} samples are still larger than the budget after --oversize split",
                            collective=True)
    # the tokens (size units) lost too, not only the samples: recorded only when some were,
    # so plans that lost none keep their content hash
    lost = samples.size[over]
    if opts.oversize == "skip":
        info["skipped"] = count
        info["skipped_tokens"] = comm.allreduce(exact_sum(lost), "sum")
        # start/total stay: the greedy maps its pieces through the skip, row packing renumbers
        return samples.select(~over, samples.start, samples.total), info
    size = samples.size.copy()
    cap = truncate_length(opts)
    size[over] = cap
    info["truncated"] = count
    info["truncated_tokens"] = comm.allreduce(exact_sum(lost - cap), "sum")
    return replace(samples, size=size), info
