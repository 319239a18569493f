"""What fits a micro-batch: oversize samples (refused, skipped, truncated) and empty ones.

A sample's cost alone, the longest that fits and why one does not are the budget's
(``budgets.BUDGETS``, the ``--budget`` registry); the costs inside the greedy are the kernels'
(``kernels.budget``). Here are the filters every packer applies first: ``drop_empty`` (samples
of no content), ``refuse_oversize`` (``--oversize error``, before the sort) and
``apply_oversize`` (skip or truncate), and what ``--oversize truncate`` and ``--static-shapes``
ask of a budget (``truncate_length``, ``static_batch_size``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ... import kernels
from ...distribute import global_start
from ...errors import SortpackError
from ...inputs.measures import measure_of
from ...parallel import Comm
from ..samples import SampleColumns, exact_sum
from .budgets import budget_of
from .options import PackOptions


def padded_lengths(opts: PackOptions, lengths: np.ndarray) -> np.ndarray:
    """Return the padded lengths of raw lengths under ``--pad-to-multiple``/``--shapes`` (-1 where no shape fits)."""
    return kernels.round_lengths(lengths, opts.pad_to_multiple,
                                 np.asarray(opts.shapes, np.int64) if opts.shapes else None)


def alone_cost(opts: PackOptions, sizes: np.ndarray) -> np.ndarray:
    """Return each sample's cost alone in a micro-batch (inf where no shape fits)."""
    lengths = padded_lengths(opts, sizes) if opts.rounding else np.asarray(sizes, np.int64)
    cost = budget_of(opts).cost_alone(lengths).astype(np.float64)
    cost[lengths < 0] = np.inf
    return cost


def _capped(opts: PackOptions, measures: np.ndarray | dict[str, np.ndarray] | None
            ) -> list[tuple[str, int, np.ndarray]]:
    """Return (measure, N, values) of each cap whose measure is given (an array alone is ``size2``)."""
    if measures is None:
        return []
    given = {"size2": measures} if isinstance(measures, np.ndarray) else measures
    return [(name, n, np.asarray(given[name])) for name, n in opts.cap_list if name in given]


def oversize_mask(opts: PackOptions, sizes: np.ndarray,
                  measures: np.ndarray | dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Return which samples cannot fit a micro-batch (or a row) alone (``measures``: their measures by name, or
    the ``size2`` array alone; a sample over a cap alone is oversize too)."""
    if opts.rows:
        over = np.asarray(sizes) > opts.rows
    elif budget_of(opts).cost_is_size():
        over = np.asarray(sizes) > opts.limit  # cost alone is the size: no temporaries
    else:
        over = alone_cost(opts, sizes) > opts.limit
    for _, n, values in _capped(opts, measures):
        over |= values > n
    return over


def _oversize(opts: PackOptions, sizes: np.ndarray,
              measures: np.ndarray | dict[str, np.ndarray] | None = None) -> np.ndarray | None:
    """Return ``oversize_mask(opts, sizes, measures)``, or None when no sample is oversize.

    A sample's cost alone only grows with its size (rounding up to shapes or multiples, the
    budgets' costs) and a cap is a plain bound: when the largest of each fits, every sample
    does, and no mask as long as the column is made.
    """
    sizes = np.asarray(sizes)
    if not len(sizes):
        return None
    tops = {name: values.max(keepdims=True) for name, _, values in _capped(opts, measures) if len(values)}
    if not oversize_mask(opts, sizes.max(keepdims=True), tops)[0]:
        return None
    return oversize_mask(opts, sizes, measures)


def oversize_reason(opts: PackOptions, largest: int) -> str:
    """Return why samples up to ``largest`` do not fit alone, naming the option to change.

    The budget is not always to blame: a sample may exceed the largest of ``--shapes``,
    ``--pad-to-multiple`` may round it past the budget, or a small ``--quadratic-scale``
    may make its cost exceed the budget although its size does not.
    """
    b = opts.limit
    if opts.rows:
        return f"do not fit --rows {opts.rows} alone (largest size {largest}); raise --rows"
    if opts.shapes and largest > max(opts.shapes):
        return (f"are longer than the largest of --shapes ({max(opts.shapes)}; largest size {largest}); "
                f"add a longer shape")
    length = int(padded_lengths(opts, np.array([largest], np.int64))[0]) if opts.rounding else largest
    reason = budget_of(opts).over_reason(largest)
    if reason is not None:
        return reason
    if length > b >= largest:
        flag = f"--pad-to-multiple {opts.pad_to_multiple}" if opts.pad_to_multiple > 1 else "--shapes"
        return (f"are padded past --max-tokens {b} by {flag} (largest size {largest} pads to {length}); "
                f"use a smaller {flag.split()[0]} or raise --max-tokens")
    return f"do not fit --max-tokens {b} alone (largest size {largest}); raise --max-tokens"


def truncate_length(opts: PackOptions) -> int:
    """Return the largest sample length that fits the budget alone (for ``--oversize truncate``)."""
    b = opts.limit
    if opts.rows:
        return opts.rows
    cap = budget_of(opts).longest_alone()
    if opts.shapes:
        fitting = [s for s in opts.shapes if s <= cap]
        if not fitting:
            raise SortpackError(f"--shapes: no shape fits --max-tokens {b} alone")
        return fitting[-1]
    if opts.pad_to_multiple > 1:
        cap = (cap // opts.pad_to_multiple) * opts.pad_to_multiple
        if cap <= 0:
            raise SortpackError(f"--pad-to-multiple {opts.pad_to_multiple} exceeds --max-tokens {b}")
    return cap


def static_batch_size(opts: PackOptions, lengths: np.ndarray) -> np.ndarray:
    """Return the fixed batch size of each padded length under ``--static-shapes``.

    The most samples the budget (and ``--max-samples``) allows at that length, rounded
    down to a multiple of ``--batch-multiple`` when at least one multiple fits.
    """
    cap = kernels.batch_capacity(lengths, opts.limit, budget_of(opts).kernel, opts.scale, opts.max_samples)
    m = opts.batch_multiple
    return np.where(cap >= m, cap // m * m, cap)


class OversizeError(SortpackError):
    """Samples larger than the budget under ``--oversize error`` (``run`` adds how to keep its analysis)."""


def content_empty(samples: SampleColumns, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Return which samples (of ``lo:hi``) have no content: a size no larger than what an empty sample measures,
    or none of a measure that trains (``Measure.trains``: the loss targets).

    Under ``--size tokens`` with special tokens an empty text measures the tokens the
    post-processor adds (``[CLS] [SEP]``: 2), which analyze records as ``empty_size``; a
    text of whitespace only measures the same and holds no token either. Every other size
    kind measures an empty sample as 0.
    """
    empty = samples.size[lo:hi] <= samples.empty_size
    if samples.begin is not None:
        empty &= samples.begin[lo:hi] == 0  # a document's last piece may hold just [SEP]: it is content all the same
    for values in _training_measures(samples):
        # fine-tuning data: a sample (or piece) without a loss target trains nothing (an empty completion,
        # a chat without an assistant turn, a piece of prompt only)
        empty |= values[lo:hi] <= 0
    return empty


def _training_measures(samples: SampleColumns) -> list[np.ndarray]:
    """Return the samples' measures without which a sample trains nothing (``inputs.measures``: ``trains``)."""
    return [values for name, values in sorted(samples.measures.items()) if measure_of(name).trains]


def drop_empty(comm: Comm, samples: SampleColumns, opts: PackOptions) -> tuple[SampleColumns, int]:
    """Return the samples without content-empty ones (unless ``keep_empty``) and how many there were over all ranks.

    An empty sample has no token to train on: alone or together, empty samples make
    micro-batches of pure padding (or of special tokens only). The rest keep their order
    and sample ids; positions close up globally, so the packing does not depend on the
    rank count.
    """
    size = samples.size
    # sizes alone decide (no pieces, no targets): when the smallest has content, every sample has (no mask)
    none_empty = samples.begin is None and not _training_measures(samples) and (
        not len(size) or int(size.min()) > samples.empty_size)
    empty = None if none_empty else content_empty(samples)
    count = comm.allreduce(0 if empty is None else int(empty.sum()), "sum")
    if count == 0 or opts.keep_empty:
        return samples, count
    keep = ~(content_empty(samples) if empty is None else empty)  # another rank's samples are empty
    start, total = global_start(comm, int(keep.sum()))
    return samples.select(keep, start, total), count


def refuse_oversize(comm: Comm, samples: SampleColumns, opts: PackOptions) -> None:
    """Raise OversizeError (on every rank) when a sample does not fit alone under ``--oversize error``.

    ``run`` calls it right after analyze, before the sort, so a plan that cannot be packed
    fails in seconds rather than after the sort (pack calls it again through ``apply_oversize``).
    """
    check_measured(opts, samples)
    if opts.oversize != "error":
        return
    for name, n, values in _capped(opts, samples.measures):
        over2 = values > n
        count = comm.allreduce(int(over2.sum()), "sum")
        if count:
            largest = comm.allreduce(int(values[over2].max()) if over2.any() else 0, "max")
            what = (f"a second size over --max-size2 {n} alone (largest {largest}); raise --max-size2"
                    if name == "size2" and opts.max_size2 else
                    f"{name} over its cap {n} alone (largest {largest}); raise the cap (--cap {name}=N)")
            raise OversizeError(f"{count} samples have {what} or use --oversize skip", collective=True)
    over = _oversize(opts, samples.size)
    count = comm.allreduce(0 if over is None else int(over.sum()), "sum")
    if count:
        largest = comm.allreduce(int(samples.size[over].max()) if over is not None and over.any() else 0, "max")
        ways = ("--oversize skip (a capped measure cannot be cut)" if opts.cap_list else
                "--oversize split (cut them into pieces that fit, no token lost), skip or truncate")
        raise OversizeError(f"{count} samples {oversize_reason(opts, largest)}, or use {ways}", collective=True)


def check_measured(opts: PackOptions, samples: SampleColumns) -> None:
    """Raise SortpackError (every rank) when a cap or the encoder's cost names a measure the samples lack."""
    wanted = [(name, "caps") for name, _ in opts.cap_list]
    wanted += [(m, "encoder") for m in (opts.encoder_patches, opts.encoder_squares() if opts.encoder_patches
                                        else None) if m]
    for name, why in wanted:  # the same options and columns on every rank
        if name in samples.measures:
            continue
        if why == "encoder":
            raise SortpackError(f"--encoder-patches/--encoder-attention name the measure {name!r}, which these "
                                f"samples do not carry: give --measure {name}=SPEC (or --cap) at analyze or run",
                                collective=True)
        if name == "size2" and opts.max_size2:
            raise SortpackError("--max-size2 N caps the second size: give --size2 SPEC (at analyze or run)",
                                collective=True)
        raise SortpackError(f"--cap {name}: these samples carry no measure {name!r} (the k-th --max-size2 caps the "
                            f"k-th --size2: size2, size3, ...; --cap NAME=SPEC:N measures and caps it)",
                            collective=True)


def apply_oversize(comm: Comm, samples: SampleColumns, opts: PackOptions) -> tuple[SampleColumns, dict]:
    """Return the samples after the ``--oversize`` policy, and counts of what it did (over all ranks)."""
    refuse_oversize(comm, samples, opts)
    maybe = _oversize(opts, samples.size, samples.measures)
    count = comm.allreduce(0 if maybe is None else int(maybe.sum()), "sum")
    info = {"oversize": count, "skipped": 0, "truncated": 0}
    if count == 0:
        return samples, info
    over = np.zeros(len(samples.size), bool) if maybe is None else maybe  # another rank's samples are over
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
