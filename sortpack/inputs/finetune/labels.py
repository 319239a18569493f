"""The pre-tokenized shape: a token-id list column with a ``labels`` list column aligned to it, checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa

from ...arrow_types import is_list
from ...errors import SortpackError
from .base import FineTuneShape
from .encoded import IGNORE_INDEX, Encoded, Rows, checked_column, rows_of, targets_of

_INT32_MAX = 2**31 - 1  # labels and ids are stored as int32


def _list_column(col, rows: Rows, name: str) -> pa.Array:
    """Return a list-of-integers column as one array; one line naming the column when its type or a null is wrong."""
    col = checked_column(col, rows, name, lambda t: is_list(t) and pa.types.is_integer(t.value_type),
                         "a list of token ids")
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _check_labels(values: np.ndarray, sizes: np.ndarray, rows: Rows, name: str, vocab_size: int | None) -> None:
    """Raise one line naming the row and position of the first label that is neither -100 nor a token id."""
    top = _INT32_MAX if vocab_size is None else vocab_size - 1
    bad = np.flatnonzero((values != IGNORE_INDEX) & ((values < 0) | (values > top)))
    if not len(bad):
        return
    at = int(bad[0])
    row = int(np.searchsorted(np.cumsum(sizes), at, side="right"))
    pos = at - int(np.sum(sizes[:row]))
    ids = f"a token id of the tokenizer (0..{top})" if vocab_size is not None else "a token id (0..2^31-1)"
    raise SortpackError(f"{rows.at(row)}: column {name!r} holds {int(values[at])} at position {pos}: a label is "
                        f"{IGNORE_INDEX} (no target) or {ids} ({len(bad)} such labels)")


def pretokenized(ids_col, labels_col, where: str | Rows, names: tuple[str, str] = ("input_ids", "labels"),
                 vocab_size: int | None = None) -> Encoded:
    """Return the ``Encoded`` of a token-id list column and its aligned labels list column, checked.

    ``names``: the two columns' names (in messages). Raises SortpackError (naming the file, the
    column and the row) when a column is not a list of integers, holds nulls, a sample's labels
    differ in length from its ids, or a label is neither -100 nor a token id (below
    ``vocab_size`` when a tokenizer is known).
    """
    from ... import arrow_compute as ac

    rows = rows_of(where)
    ids_name, labels_name = names
    ids = _list_column(ids_col, rows, ids_name)
    labels = _list_column(labels_col, rows, labels_name)
    sizes = ac.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = ac.list_value_length(labels).to_numpy(zero_copy_only=False).astype(np.int64)
    bad = np.flatnonzero(sizes != lengths)
    if len(bad):
        i = int(bad[0])
        raise SortpackError(f"{rows.path}: column {labels_name!r} has {lengths[i]} labels in {rows.row(i)}, "
                            f"column {ids_name!r} {sizes[i]} token ids ({len(bad)} rows differ)")
    flat = ac.list_flatten(labels)
    if flat.null_count:
        raise SortpackError(f"{rows.path}: column {labels_name!r} holds null labels")
    values = flat.to_numpy(zero_copy_only=False)
    _check_labels(values, sizes, rows, labels_name, vocab_size)
    return Encoded(ids, labels, sizes, targets_of(values != IGNORE_INDEX, sizes))


@dataclass(frozen=True, eq=False, kw_only=True)
class LabelsShape(FineTuneShape):
    """``--labels-column``: token ids (``column``, default ``input_ids``) with their labels (``labels_column``); a
    loaded tokenizer, when there is one, bounds the labels by its vocabulary."""

    name: ClassVar[str] = "labels"
    option: ClassVar[str] = "--labels-column"
    encodes_text: ClassVar[bool] = False

    labels_column: str = "labels"
    column: str = "input_ids"

    def columns(self) -> list[str]:
        """Return the ids and labels columns."""
        return [self.column, self.labels_column]

    def encode_rows(self, table: pa.Table, rows: Rows) -> Encoded:
        """Return the ids and labels as they are, checked (``pretokenized``)."""
        vocab = self.tokenizer.get_vocab_size(with_added_tokens=True) if self.tokenizer is not None else None
        return pretokenized(table.column(self.column), table.column(self.labels_column), rows,
                            (self.column, self.labels_column), vocab)

    def record(self) -> dict:
        """Return the labels column (the ids column is the plan's ``--column``)."""
        return {"shape": self.name, "labels_column": self.labels_column}

    @classmethod
    def from_record(cls, record: dict, column: str | None) -> LabelsShape:
        """Return the shape of a plan's record."""
        return cls(labels_column=record["labels_column"], column=column or "input_ids")

    def plan_column(self, given: str | None) -> str | None:
        """Return the ids column: the store cuts it with the labels at a split."""
        return given or self.column

    @property
    def stored_labels(self) -> str | None:
        """Return the labels column."""
        return self.labels_column

    def stored_columns(self) -> tuple[str, ...]:
        """Return the ids and labels columns: ``--store`` takes them as they are."""
        return self.column, self.labels_column
