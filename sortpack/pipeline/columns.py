"""The column policy of every plan: which column it names, and which columns its inputs must hold.

One rule for ``run``, ``pack`` and a mixture (a plain plan is one source without a column of
its own). ``plan_columns`` is the pure half: from what the plan asks (``ColumnRequest``) and
the column names of its inputs' files it returns the ``ColumnPlan`` or raises the one-line
refusal; ``read_columns`` reads the names (collective) only when the request needs them.

- The plan's column is ``--column``; else, when a source names its own ``column`` or
  ``--oversize split`` cuts the text, the column the plain sources read (as analyze resolves
  it: the only one, else ``text``), else the first source's own ``column``. A split plan names
  the column it cuts even where analyze chose it: the store and the reader cut the column the
  options name. Other plans keep ``--column`` as given (None), which keeps their content hash.
- Each file must hold its source's own ``column``, the text column where a SPEC reads it, and
  every ``--store`` column (a source's own column stands for the plan's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ..inputs.columns import check_columns, first_columns, input_columns, reads_text, resolve_column
from ..inputs.size_kinds import split_kinds
from ..parallel import Comm
from ..stages.analyze import AnalyzeOptions

if TYPE_CHECKING:
    from ..write.store import StoreOptions

__all__ = ["ColumnPlan", "ColumnRequest", "FileColumns", "plan_columns", "read_columns"]

# (path, column names) of each file of a source, as ``inputs.columns.input_columns`` reads them
FileColumns = list[tuple[str, list[str]]]


@dataclass(frozen=True)
class ColumnRequest:
    """What a plan asks of its inputs' columns.

    ``sources`` are a mixture's (name, own ``column`` or None), empty for a plain plan (one
    source, its errors without a source's name).
    """

    column: str | None  # --column as given
    text: bool = False  # a SPEC (or --store-tokens) reads the text column
    store: tuple[str, ...] = ()  # --store's columns
    splitting: bool = False  # --oversize split of a size kind that cuts text
    sources: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def of(cls, aopts: AnalyzeOptions, oversize: str, store: StoreOptions | None = None,
           sources: tuple[tuple[str, str | None], ...] = ()) -> ColumnRequest:
        """Return the request of a plan measured with ``aopts`` (``oversize``: --oversize, ``store``: --store)."""
        storing = store is not None and store.enabled
        return cls(aopts.column, reads_text(aopts.size, aopts.difficulty, storing and bool(store and store.tokens)),
                   tuple(store.columns) if store is not None and storing else (),
                   oversize == "split" and str(aopts.size or "length") in split_kinds(), sources)

    @property
    def own_columns(self) -> list[str | None]:
        """Return each source's own column (a plain plan: one source without one)."""
        return [own for _, own in self.sources] if self.sources else [None]

    @property
    def reads_files(self) -> bool:
        """Return whether the policy needs the inputs' column names (else the plan's column is ``--column``)."""
        return bool(any(self.own_columns) or self.store or (self.column and self.text) or self.splitting)


class ColumnPlan(NamedTuple):
    """The plan's column (recorded in its options) and each source's file count (None: the files were not read)."""

    column: str | None
    file_counts: list[int] | None = None


def plan_columns(request: ColumnRequest, files: list[FileColumns] | None) -> ColumnPlan:
    """Return the plan's column and file counts, or raise the one-line refusal of a column a file lacks (pure).

    ``files``: each source's files' column names (``read_columns``), None where
    ``request.reads_files`` is false.
    """
    if files is None or not request.reads_files:
        return ColumnPlan(request.column)
    plan = _plan_column(request, files)
    where = [f"mixture source {name!r}: " for name, _ in request.sources] or [""]
    for prefix, own, fs in zip(where, request.own_columns, files):
        check_columns(fs, _wanted(request, plan, own), prefix)
    return ColumnPlan(plan, [len(fs) for fs in files])


def _plan_column(request: ColumnRequest, files: list[FileColumns]) -> str | None:
    """Return ``--column``, else (a source's own column, or a split) the plain sources' text column, else the
    first own column."""
    owns = request.own_columns
    if request.column is not None or not (any(owns) or request.splitting):
        return request.column
    plain = [f for own, fs in zip(owns, files) if not own for f in fs]
    return resolve_column(first_columns(plain)) or next((c for c in owns if c), None)


def _wanted(request: ColumnRequest, plan: str | None, own: str | None) -> list[tuple[str, str]]:
    """Return the (column, why) pairs each file of a source reading ``own`` (None: the plan's) must hold."""
    read = own or plan
    wanted = [(own, "its 'column'")] if own else []
    if read and request.text and not own:
        wanted.append((read, "--column" if request.column else "the text column"))
    return wanted + [(read if c == plan and read else c, f"--store {c}") for c in request.store]


def read_columns(comm: Comm, request: ColumnRequest, inputs: list[list[str]], input_format: str = "auto",
                 split: str | None = None) -> ColumnPlan:
    """Return ``plan_columns`` of each source's ``inputs``, their column names read only where needed (collective)."""
    if not request.reads_files or not any(inputs):
        return ColumnPlan(request.column)
    return plan_columns(request, input_columns(comm, inputs, input_format, split))
