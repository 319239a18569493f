"""This rank's input rows to store, unit by unit with their output positions, and each row's bytes in memory."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ... import arrow_compute as ac
from ...arrow_types import is_offset_bytes, is_offset_list
from ...errors import SortpackError, one_line
from ...inputs.fast_tokens import token_ids
from ...inputs.formats import read_units
from ...inputs.renames import as_plan_names, read_names
from ...inputs.source_file import SourceFile
from .options import LABELS_COLUMN, TOKENS_COLUMN, TokenIds
from .token_cache import TokenCache


def row_bytes(table: pa.Table) -> np.ndarray:
    """Return an estimate of each row's bytes in memory (values plus offsets), per row."""
    n = table.num_rows
    total = np.zeros(n, dtype=np.int64)
    for col in table.columns:
        total += column_row_bytes(col)
    return total


def column_row_bytes(col: pa.ChunkedArray) -> np.ndarray:
    """Return an estimate of each row's bytes in one column."""
    n, t = len(col), col.type
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if is_offset_bytes(t):
        return ac.fill_null(ac.binary_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64) + 8
    if is_offset_list(t) and pa.types.is_primitive(t.value_type):
        width = max(1, t.value_type.bit_width // 8)
        lengths = ac.fill_null(ac.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return lengths * width + 8
    if pa.types.is_primitive(t):
        return np.full(n, max(1, t.bit_width // 8), dtype=np.int64)
    return np.full(n, -(-col.nbytes // n), dtype=np.int64)


def _cut_pieces(table: pa.Table, columns: tuple[str, ...], begin: np.ndarray, end: np.ndarray,
                unit: str = "length") -> pa.Table:
    """Return ``table`` with ``columns`` cut to each row's piece range (``--oversize split``, in ``unit``)."""
    from ...inputs.pieces import cut_array

    for name in columns:
        if name in table.column_names:
            i = table.column_names.index(name)
            table = table.set_column(i, table.schema.field(i), cut_array(table.column(i), begin, end, unit))
    return table


def _id_lists(col: pa.ChunkedArray, name: str, where: str) -> pa.ChunkedArray:
    """Return a column of token-id lists as list<int32> (the stored ids' type), refusing any other type."""
    from ...inputs.size_kinds import is_list_of_ids

    if not is_list_of_ids(col.type):
        raise SortpackError(f"{where}: column {name!r} is {col.type}, not token ids; --store-tokens of text needs "
                            "--tokenizer")
    try:
        return col.cast(pa.list_(pa.int32()))
    except (pa.ArrowException, TypeError) as exc:
        raise SortpackError(f"{where}: column {name!r}: token ids beyond int32 ({one_line(exc)})") from None


@dataclass
class RowPositions:
    """Every use of this rank's input rows: ``rows`` (local row numbers, ascending) and their output ``positions``."""

    rows: np.ndarray
    positions: np.ndarray
    begin: np.ndarray | None = None  # --oversize split: each use's range in the row
    end: np.ndarray | None = None
    cut: tuple[str, ...] = ()  # the columns cut to the range (the others are stored whole)
    unit: str = "length"  # what the ranges count: "bytes" cuts a text's UTF-8 bytes, not its characters


@dataclass
class InputRows:
    """This rank's input rows, unit by unit, with each row's output position."""

    srcs: list[SourceFile]
    files: list[dict]
    units: list[tuple[int, int]]  # (file, unit) in global order
    first_row: int
    uses: RowPositions
    read_columns: list[str]
    schema: pa.Schema
    tokens: TokenIds | None
    cache: TokenCache | None  # the ids analyze computed while counting, if kept
    renames: list[dict[str, str] | None] | None = None  # per file: {plan column: input column}
    cursor: int = 0
    row: int = 0
    seconds: float = 0.0  # reading, decoding and converting the input units

    def done(self) -> bool:
        """Return whether every unit has been read."""
        return self.cursor >= len(self.units)

    def _text_columns(self) -> list[str]:
        """Return the text columns the token ids are made from (read as strings from CSV and JSON)."""
        assert self.tokens is not None
        shape = self.tokens.shape
        if self.tokens.tokenizer is None and shape is None:  # token ids as they are: no text
            return []
        return shape.text_columns() if shape is not None else [self.tokens.column]

    def next_table(self) -> tuple[pa.Table, np.ndarray]:
        """Return the next unit's stored columns and its rows' positions (rows not in the plan dropped)."""
        t0 = time.perf_counter()
        try:
            return self._next_table()
        finally:
            self.seconds += time.perf_counter() - t0

    def _next_table(self) -> tuple[pa.Table, np.ndarray]:
        fidx, unit = self.units[self.cursor]
        self.cursor += 1
        src, entry = self.srcs[fidx], self.files[fidx]
        expected = src.unit_rows[unit] if src.unit_rows is not None else int(entry["rows"])
        if expected == 0:
            return self.schema.empty_table(), np.zeros(0, np.int64)
        rename = self.renames[fidx] if self.renames else None
        text = read_names(self._text_columns(), rename) if self.tokens is not None else None
        if self.read_columns:
            table = read_units(src, unit, unit + 1, read_names(self.read_columns, rename), text_columns=text)
            if rename is not None:  # a mixture source's own column, under the plan's name
                keep, names = as_plan_names(table.column_names, rename)
                table = table.select(keep).rename_columns(names)
        else:  # only token ids, all from analyze's cache: nothing to read
            table = pa.table({"_": pa.nulls(expected)})
        if table.num_rows != expected:
            raise SortpackError(f"{src.path}: read {table.num_rows} rows, the plan was analyzed from {expected} "
                                "(the input changed since analyze)")
        cols = {}
        made = self._token_ids(table, src.path, expected) if self.tokens is not None else {}
        for f in self.schema:
            if f.name in made:
                cols[f.name] = made[f.name]
            else:
                col = table.column(f.name)
                try:
                    cols[f.name] = col.cast(f.type) if col.type != f.type else col
                except (pa.ArrowException, TypeError) as exc:
                    raise SortpackError(f"{src.path}: column {f.name!r} ({col.type}) does not convert to "
                                        f"{f.type} ({one_line(exc)})") from None
        rows, positions = self.uses.rows, self.uses.positions
        a, b = np.searchsorted(rows, [self.row, self.row + expected])
        take, pos = rows[a:b] - self.row, positions[a:b]
        self.row += expected
        out = pa.table(cols, schema=self.schema)
        if b - a != expected or bool(np.any(np.diff(take) != 1)):
            # rows left out of the plan, or used more than once (a mixture's repeats, a split's pieces)
            out = out.take(pa.array(take))
        if self.uses.begin is not None and self.uses.end is not None:
            out = _cut_pieces(out, self.uses.cut, self.uses.begin[a:b], self.uses.end[a:b], self.uses.unit)
        return out, pos

    def _token_ids(self, table: pa.Table, where: str, expected: int) -> dict[str, pa.Array | pa.ChunkedArray]:
        """Return the stored token ids (and labels, of fine-tuning texts) of the unit being read: from the cache,
        else tokenized; truncated."""
        from ...inputs.specs import _column

        assert self.tokens is not None
        names = (TOKENS_COLUMN, LABELS_COLUMN) if self.tokens.labels else (TOKENS_COLUMN,)
        if self.cache is not None:  # the ids analyze computed while counting
            first = self.first_row + self.row
            got = {name: self.cache.rows_of(first, first + expected, name) for name in names}
        elif self.tokens.shape is not None:  # loaded: a chat's template too (``token_ids_options``)
            encoded = self.tokens.shape.encode(table, where)
            got = {TOKENS_COLUMN: encoded.ids, LABELS_COLUMN: encoded.labels}
        elif self.tokens.tokenizer is None:  # the column holds the ids (a Megatron dataset): stored as they are
            got = {TOKENS_COLUMN: _id_lists(_column(table, self.tokens.column, where), self.tokens.column, where)}
            if self.tokens.labels_column is not None:
                got[LABELS_COLUMN] = _id_lists(_column(table, self.tokens.labels_column, where),
                                               self.tokens.labels_column, where)
        else:
            got = {TOKENS_COLUMN: token_ids(self.tokens.tokenizer, _column(table, self.tokens.column, where),
                                            self.tokens.special_tokens)[0]}
        if self.tokens.truncate:
            got = {name: ac.list_slice(ids, 0, self.tokens.truncate) for name, ids in got.items()}
        return got
