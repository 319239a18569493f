"""The ``Samples`` contract: what the collate helpers ask of the items a dataset hands them, as one ``Protocol``.

A collate function receives a micro-batch's items. Beyond the items themselves (a sequence),
the helpers ask nine questions, each answered by an attribute or a method below; ``Samples``
(``microbatch.py``) answers all nine with "nothing known", ``lazy_rows.TableSamples``
answers the stored-data ones from the plan's shards, and ``SourceDataset`` fills in the
rest. mypy holds every reader of the items (``tokens.py``, the collate modules) to this one
definition, so a new question is a new member here, not a ``getattr`` somewhere.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..kernels.tokens import TokenView
from .microbatch import MicroBatch, Samples


class DocumentCache(Protocol):
    """Where the token ids of long documents whose pieces a collate cuts are kept (``tokens.TokenCache``)."""

    def get(self, key) -> tuple[np.ndarray, np.ndarray | None] | None:
        """Return the (ids, labels or None) kept for ``key`` (None: not kept)."""

    def put(self, key, ids: tuple[np.ndarray, np.ndarray | None]) -> None:
        """Keep (ids, labels or None) for ``key``."""


@runtime_checkable
class SamplesContract(Protocol):
    """A micro-batch's items (a sequence) and what the collate helpers learn about them.

    Attributes
    ----------
    microbatch : MicroBatch or None
        The micro-batch the items were read for: its shape (``batch_size``, ``padded_size``,
        ``row_splits``), its step and its source (None: a plain list of items).
    table : pyarrow.Table or RecordBatch or None
        The same rows as one Arrow slice (stored data): token ids are read from its buffers.
    token_ranges : (numpy.ndarray, numpy.ndarray) or None
        ``(begin, end)`` per item of a split plan's pieces, cut from what ``tokenize`` returns.
    size_unit : str or None
        What the plan's sizes count; under ``"tokens"`` ``tokenize`` is checked against the plan.
    token_cache : DocumentCache or None
        Where the ids of long documents are kept while their pieces come by.
    sample_ids : numpy.ndarray or None
        The items' sample ids when known as an array (stored rows), else None.
    sample_ids_at : int
        The data address of ``sample_ids`` for the compiled kernels (0: unknown).
    """

    microbatch: MicroBatch | None
    table: Any
    token_ranges: Any
    size_unit: str | None
    token_cache: Any
    sample_ids: Any
    sample_ids_at: int

    def __len__(self) -> int:
        """Return the number of items."""

    def __getitem__(self, i: Any) -> Any:
        """Return item ``i``."""

    def __iter__(self) -> Iterator[Any]:
        """Yield the items in the micro-batch's order."""

    def has_column(self, key: str) -> bool:
        """Return whether the items' Arrow slice has a column ``key``."""

    def token_view(self, key: str) -> TokenView | None:
        """Return a zero-copy ``TokenView`` of column ``key`` the items' source holds, or None (read ``table``)."""


def as_samples(items: Any) -> SamplesContract:
    """Return ``items`` as the contract: ``Samples`` (or any object that keeps it) as given, anything else wrapped.

    A plain sequence (a ``DataLoader`` batch of a dataset without ``__getitems__``) becomes
    ``Samples`` of its items, with the ``microbatch`` it carries if it carries one.
    """
    if isinstance(items, Samples) or isinstance(items, SamplesContract):
        return items
    return Samples(items, getattr(items, "microbatch", None))
