"""What encoding fine-tuning data gives: token ids with their loss-target labels (``Encoded``), where rows come from
(``Rows``, for error lines), and the numpy that turns per-token target flags into labels and target counts."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa

from ...errors import SortpackError
from ..row_names import RowName, Rows  # noqa: F401  (where error lines name rows: any input, not only fine-tuning)

IGNORE_INDEX = -100  # the label of a position without a target (PyTorch's and Hugging Face's default)


@dataclass
class Encoded:
    """Token ids and labels of a batch of samples: ``ids``/``labels`` list<int32> arrays, ``sizes`` and
    ``targets`` (int64 per sample: tokens, and the loss targets: positions after the first whose label is
    not -100, what a collate trains, as it gives every document's first position no target).

    ``roles``: the message roles the batch's chats hold (None for other shapes), so a job can say
    when ``--train-on`` names a role no message has.
    """

    ids: pa.Array
    labels: pa.Array
    sizes: np.ndarray
    targets: np.ndarray
    roles: frozenset[str] | None = None


def checked_column(col, rows: Rows, name: str, fits: Callable[[pa.DataType], bool], what: str):
    """Return a column as one array (a plain column of a chunked one), one line naming it when its type does not
    ``fits`` (is not ``what``) or it holds a null (naming the first's row)."""
    from ...arrow_types import plain_column

    col = plain_column(col) if isinstance(col, pa.ChunkedArray) else col
    if not fits(col.type):
        raise SortpackError(f"{rows.path}: column {name!r} is {col.type}, not {what}")
    if col.null_count:
        first = int(np.flatnonzero(np.asarray(col.is_null()))[0])
        raise SortpackError(f"{rows.path}: column {name!r} has {col.null_count} null values (the first in "
                            f"{rows.row(first)})")
    return col


def rows_of(where: str | Rows) -> Rows:
    """Return ``where`` as ``Rows`` (a file name alone: its rows counted from 0)."""
    return where if isinstance(where, Rows) else Rows(str(where))


def lists(values: np.ndarray, counts: np.ndarray) -> pa.Array:
    """Return a list<int32> array of ``values`` cut by ``counts``."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int32, copy=False), pa.int32()))


def labels_of(ids: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Return the labels of flat ``ids``: the id where ``target`` holds, else -100."""
    return np.where(target, ids, IGNORE_INDEX).astype(np.int32)


def segment_sums(flags: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Return the number of true ``flags`` in each run of ``counts`` positions."""
    cum = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
    ends = np.cumsum(counts, dtype=np.int64)
    return cum[ends] - cum[ends - counts]


def targets_of(flags: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Return each run's loss targets: its true ``flags`` but the first position's (no target: nothing precedes it)."""
    counts = np.asarray(counts, dtype=np.int64)
    first = np.cumsum(counts) - counts
    head = np.zeros(len(counts), dtype=np.int64)
    some = counts > 0
    head[some] = flags[first[some]]
    return segment_sums(flags, counts) - head


def flat_ids(encs) -> tuple[np.ndarray, np.ndarray]:
    """Return the ``tokenizers`` encodings' ids one after another (int64) and each one's count."""
    counts = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
    ids = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.int64, count=int(counts.sum()))
    return ids, counts


def positions(counts: np.ndarray) -> np.ndarray:
    """Return each flat position's index within its run of ``counts``."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


def common_prefix(a: np.ndarray, a_counts: np.ndarray, b: np.ndarray, b_counts: np.ndarray) -> np.ndarray:
    """Return, per pair of runs (``a``'s i-th of ``a_counts``, ``b``'s i-th), how many leading values they share."""
    a_counts = np.asarray(a_counts, dtype=np.int64)
    b_counts = np.asarray(b_counts, dtype=np.int64)
    run = np.repeat(np.arange(len(a_counts), dtype=np.int64), a_counts)
    pos = positions(a_counts)
    inside = pos < b_counts[run]  # b's value at the same position exists
    same = np.zeros(len(a), dtype=bool)
    b_start = np.cumsum(b_counts) - b_counts
    same[inside] = a[inside] == b[b_start[run[inside]] + pos[inside]]
    # the first position of each run where they differ (or the shorter run's end)
    stop = np.minimum(a_counts, b_counts)
    differ = np.flatnonzero(~same)
    first = np.full(len(a_counts), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, run[differ], pos[differ])
    return np.minimum(first, stop)


def encoded(parts_ids: list, parts_target: list, parts_counts: list, roles: frozenset[str] | None = None) -> Encoded:
    """Return the ``Encoded`` of flat ids, target flags and per-sample counts given in parts (batches)."""
    ids = np.concatenate(parts_ids) if parts_ids else np.zeros(0, np.int64)
    target = np.concatenate(parts_target) if parts_target else np.zeros(0, bool)
    counts = np.concatenate(parts_counts) if parts_counts else np.zeros(0, np.int64)
    return Encoded(lists(ids, counts), lists(labels_of(ids, target), counts), counts, targets_of(target, counts), roles)


def overlapping(start: np.ndarray, end: np.ndarray, spans: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Return, per token ``[start, end)`` (both non-decreasing), whether it overlaps a span (sorted, disjoint) of
    the same axis."""
    starts, ends = spans
    # the tokens of a span: from the first ending after its start to the last beginning before its end
    first = np.searchsorted(end, starts, side="right")
    stop = np.searchsorted(start, ends, side="left")
    marks = np.zeros(len(end) + 1, np.int32)
    np.add.at(marks, first, 1)
    np.add.at(marks, stop, -1)
    return np.cumsum(marks[:-1], dtype=np.int32) > 0
