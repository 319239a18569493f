"""``TableSamples``: a micro-batch's stored rows as ``Samples`` whose Python rows are built on first use.

A collate function that reads the Arrow slice (``Samples.table``), as ``pad_collate`` and
``varlen_collate`` do for stored token ids, never needs the rows as Python dicts; building
them anyway (``to_pylist``) turns every token into a Python int and costs more than the
fetch and the collate together. Any other use (iterating, indexing, ``list(...)``,
comparing, pickling) builds them once, so a custom collate sees the usual list of rows.
``len()`` is known without building them.
"""
from __future__ import annotations

import pickle
from typing import Any

from ..errors import SortpackError, one_line
from .microbatch import Samples


class TableSamples(Samples):
    """The rows of ``table`` (a list of dicts, or ``transform(row)``), built when first needed.

    Parameters
    ----------
    table : pyarrow.Table or RecordBatch, optional
        The micro-batch's rows (None with ``stored``: sliced from the stored data when first
        asked for).
    microbatch : MicroBatch, optional
        The micro-batch they were read for.
    transform : callable, optional
        Maps each row (a dict) to the item.
    sample_ids : numpy.ndarray, optional
        The sample id of each row of ``table`` (int32 or int64), when known: what the collate
        helpers report as ``sample_ids`` without a conversion of the ``MicroBatch`` list.
    stored : tuple, optional
        ``(StoredData, i, columns)``: the rows are micro-batch ``i`` of the stored data (its
        ``columns``, None: all); ``table`` is then sliced on first use, and ``token_view``
        reads a token column straight from the shard.

    ``sample_ids_at`` is the data address of ``sample_ids`` where ``of_stored`` knew it (0:
    unknown), for the collate kernels.
    """

    _table: Any = None
    _where: tuple[int, int, int] | None = None  # the stored rows' (shard, first row, end row), when in one shard
    sample_ids_at = 0

    def __init__(self, table=None, microbatch=None, transform=None, sample_ids=None, stored=None):
        super().__init__((), microbatch, table)
        self._transform = transform
        self._pending = True
        self.sample_ids = sample_ids
        self._stored = stored

    @classmethod
    def of_stored(cls, microbatch, transform, ids: tuple, stored: tuple, size_unit: str | None) -> TableSamples:
        """Return ``TableSamples(None, microbatch, transform, sample_ids, (StoredData, i, columns))`` of a whole stored
        micro-batch, with ``size_unit``.

        ``ids`` is (its stored sample ids, their data address) as ``PackedIndex.stored_ids_at``
        gives them; ``stored`` is ``(StoredData, i, columns, where)``, ``where`` its rows' place
        as ``StoredData.check_microbatch`` gives it. Built as one dict (the fetch of every
        micro-batch makes one): the attributes ``__init__`` sets.
        """
        data, i, columns, where = stored
        made = list.__new__(cls)
        made.__dict__ = {"microbatch": microbatch, "token_ranges": None, "size_unit": size_unit,
                         "_transform": transform, "_pending": True, "sample_ids": ids[0], "sample_ids_at": ids[1],
                         "_stored": (data, i, columns), "_where": where}
        return made

    @property
    def table(self):
        """Return the rows as one Arrow slice (of the stored data: sliced now, on first use)."""
        if self._table is None and self._stored is not None:
            stored, i, columns = self._stored
            table = stored.microbatch(i)
            self._table = table if columns is None else table.select(columns)
        return self._table

    @table.setter
    def table(self, value) -> None:
        self._table = value

    def token_view(self, key: str):
        """Return the ``TokenView`` of the token ids in column ``key`` read straight from the shard, or None.

        A whole stored micro-batch answers from its shard without slicing the table; None
        otherwise (``sortpack.reader.tokens.stored_token_view`` then reads ``table``).
        """
        if self._stored is not None and self._table is None:
            stored, i, columns = self._stored
            if columns is None or key in columns:
                where = self._where
                return stored.token_view(key, i) if where is None else stored.token_view_in(key, where)
        return None

    def has_column(self, key: str) -> bool:
        """Return whether the rows have a column ``key`` (stored rows: without slicing the table)."""
        if self._stored is not None and self._table is None:
            stored, _, columns = self._stored
            return key in (stored.columns if columns is None else columns)
        table = self.table
        return table is not None and key in table.schema.names

    def _fill(self) -> None:
        if self._pending:
            rows = self.table.to_pylist()
            if self._transform is not None:
                rows = [self._transform(r) for r in rows]
            self._pending = False  # only once built: a failed build raises again on the next use
            list.extend(self, rows)

    @property
    def built(self) -> bool:
        """Return whether the Python rows have been built."""
        return not self._pending

    def __len__(self) -> int:
        if not self._pending:
            return list.__len__(self)
        if self._table is None and self._stored is not None:
            stored, i, _ = self._stored
            return int(stored.row_start[i + 1] - stored.row_start[i])
        return self.table.num_rows

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self):
        self._fill()
        return list.__iter__(self)

    def __reversed__(self):
        self._fill()
        return list.__reversed__(self)

    def __getitem__(self, i):
        self._fill()
        return list.__getitem__(self, i)

    def __contains__(self, item) -> bool:
        self._fill()
        return list.__contains__(self, item)

    def __eq__(self, other) -> bool:
        self._fill()
        return list.__eq__(self, other)

    def __ne__(self, other) -> bool:
        self._fill()
        return list.__ne__(self, other)

    __hash__ = None  # type: ignore[assignment]  # a list: unhashable

    def __repr__(self) -> str:
        self._fill()
        return list.__repr__(self)

    def __reduce_ex__(self, protocol):
        # pickled (DataLoader workers) as plain Samples with their rows. A worker pickles its result
        # in multiprocessing's feeder thread, where an exception is printed and the result dropped:
        # the training loop would wait for it for ever. So a failure to build the rows (a shard that
        # changed, the transform's own error) is pickled instead, and raised where they are unpickled.
        try:
            self._fill()
        except Exception as exc:  # noqa: BLE001 - every failure must reach the loop, whatever its type
            return (_raise, (_picklable(exc),))
        return (Samples, (list(self), self.microbatch, self.table, self.token_ranges, self.size_unit))

    def copy(self) -> list:
        """Return the rows as a plain list."""
        self._fill()
        return list(self)

    def index(self, *args) -> int:
        """Return the place of a row (as ``list.index``)."""
        self._fill()
        return list.index(self, *args)

    def count(self, item) -> int:
        """Return how often a row occurs (as ``list.count``)."""
        self._fill()
        return list.count(self, item)

    def __setitem__(self, i, value):
        self._fill()
        list.__setitem__(self, i, value)

    def __delitem__(self, i):
        self._fill()
        list.__delitem__(self, i)

    def append(self, item) -> None:
        """Append a row (after building the others)."""
        self._fill()
        list.append(self, item)

    def extend(self, items) -> None:
        """Extend the rows (after building the others)."""
        self._fill()
        list.extend(self, items)

    def insert(self, i, item) -> None:
        """Insert a row (after building the others)."""
        self._fill()
        list.insert(self, i, item)

    def pop(self, *args):
        """Remove and return a row (as ``list.pop``)."""
        self._fill()
        return list.pop(self, *args)

    def sort(self, **kw) -> None:
        """Sort the rows in place (as ``list.sort``)."""
        self._fill()
        list.sort(self, **kw)

    def reverse(self) -> None:
        """Reverse the rows in place."""
        self._fill()
        list.reverse(self)

    def remove(self, item) -> None:
        """Remove the first equal row (as ``list.remove``)."""
        self._fill()
        list.remove(self, item)

    def clear(self) -> None:
        """Remove every row."""
        self._pending = False
        list.clear(self)

    def __add__(self, other):
        self._fill()
        return list.__add__(self, other)

    def __iadd__(self, other):
        self._fill()
        list.extend(self, other)
        return self

    def __mul__(self, n):
        self._fill()
        return list.__mul__(self, n)


def _raise(exc: BaseException):
    """Raise ``exc``: a failure pickled in a DataLoader worker, raised where its result is unpickled."""
    raise exc


def _picklable(exc: Exception) -> Exception:
    """Return ``exc`` if it survives pickling, else a ``SortpackError`` with its message on one line."""
    try:
        if isinstance(pickle.loads(pickle.dumps(exc)), type(exc)):
            return exc
    except Exception:  # noqa: BLE001,S110 - any exception that does not round-trip is replaced below
        pass
    return SortpackError(f"{type(exc).__name__}: {one_line(exc)}")
