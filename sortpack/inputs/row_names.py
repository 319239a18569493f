"""How error lines name an input table's rows (``Rows``): its file, the file's row of the table's first row, and the
format's word for a row (a JSONL file's line), worked out only when a message shows it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rows:
    """Where a table's rows come from, for error lines: its file, the file's row of its first row, and how the
    file's format names a row (``InputFormat.row_position``: a JSONL file's line; None: ``row N``)."""

    path: str
    first: int = 0
    position: Callable[[int], str] | None = None

    def row(self, i: int) -> str:
        """Return how a message names row ``i`` of the table (``line 8``, ``row 7``)."""
        at = self.first + int(i)
        return self.position(at) if self.position is not None else f"row {at}"

    def at(self, i: int) -> str:
        """Return the file and row ``i`` of the table as an error line begins (``chats.jsonl: line 8``)."""
        return f"{self.path}: {self.row(i)}"

    def named(self, i: int) -> RowName:
        """Return row ``i``'s name, worked out only when a message shows it (a JSONL line is counted in the file)."""
        return RowName(self, int(i))


@dataclass(frozen=True)
class RowName:
    """A row's ``Rows.at`` name, put together when formatted: error lines only."""

    rows: Rows
    i: int

    def __str__(self) -> str:
        """Return ``file: line N`` (``Rows.at``)."""
        return self.rows.at(self.i)
