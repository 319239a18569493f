"""The samples that enter packing: empty ones dropped, oversize ones refused, skipped or truncated."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...distribute import global_start
from ...errors import SortpackError
from ...parallel import Comm
from ..samples import SampleColumns
from .budget import oversize_mask, oversize_reason, truncate_length
from .options import PackOptions


class OversizeError(SortpackError):
    """Samples larger than the budget under ``--oversize error`` (``run`` adds how to keep its analysis)."""


def content_empty(samples: SampleColumns) -> np.ndarray:
    """Return which samples have no content: a size no larger than what an empty sample measures.

    Under ``--size tokens`` with special tokens an empty text measures the tokens the
    post-processor adds (``[CLS] [SEP]``: 2), which analyze records as ``empty_size``; a
    text of whitespace only measures the same and holds no token either. Every other size
    kind measures an empty sample as 0.
    """
    return samples.size <= samples.empty_size


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


def apply_oversize(comm: Comm, samples: SampleColumns, opts: PackOptions) -> tuple[SampleColumns, dict]:
    """Return the samples after the ``--oversize`` policy, and counts of what it did (over all ranks)."""
    over = oversize_mask(opts, samples.size)
    count = comm.allreduce(int(over.sum()), "sum")
    largest = comm.allreduce(int(samples.size[over].max()) if over.any() else 0, "max")
    info = {"oversize": count, "skipped": 0, "truncated": 0}
    if count == 0:
        return samples, info
    if opts.oversize == "error":
        raise OversizeError(f"{count} samples {oversize_reason(opts, largest)}, or use --oversize skip|truncate",
                            collective=True)
    if opts.oversize == "skip":
        info["skipped"] = count
        # start/total stay: the greedy maps its pieces through the skip, row packing renumbers
        return samples.select(~over, samples.start, samples.total), info
    size = samples.size.copy()
    size[over] = truncate_length(opts)
    info["truncated"] = count
    return replace(samples, size=size), info
