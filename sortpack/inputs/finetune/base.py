"""What every fine-tuning shape is (``FineTuneShape``): the columns it reads, how it encodes them, what a manifest
records of it and how it comes back from that record, the files it needs loaded. One subclass per shape
(``labels.LabelsShape``, ``pairs.PairsShape``, ``chats.ChatShape``), registered in ``registry.SHAPES``."""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from ...errors import SortpackError
from .encoded import Encoded, Rows, rows_of


def file_digest(path: str) -> str:
    """Return the sha256 of a file's bytes (a tokenizer a plan was measured with)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_recorded_file(option: str, given: str, recorded: str | None, what: str) -> None:
    """Raise SortpackError unless ``given`` has the file name a manifest recorded (``recorded``; None: anything)."""
    if recorded and Path(given).name != Path(recorded).name:
        raise SortpackError(f"{option} {given}: {what} {Path(recorded).name!r}")


def _handle(encoder: Any) -> Any:
    """Return a ``fast_tokens.TokenEncoder``'s LazyTokenizer (None: ``encoder`` is none)."""
    return getattr(encoder, "__dict__", {}).get("handle")


@dataclass(frozen=True, eq=False, kw_only=True)
class FineTuneShape:
    """The shape of a fine-tuning dataset: its options (the fields, what a manifest records) and, once ``loaded``,
    the tokenizer (and template) it encodes with.

    A subclass sets ``name`` (the manifest's ``fine_tune.shape``), ``option`` (the command-line
    option that names it, for messages) and ``encodes_text`` (its ids come from a tokenizer: the
    sample's size is their count, ``--store-tokens`` stores them with their labels), and defines
    ``columns``, ``encode``, ``record`` and ``from_record``. Two shapes are equal when they record
    the same options and hold the same tokenizer object: a collate's ``tokenize=`` (a loaded shape
    is one) keys the reader's cache of cut documents.
    """

    name: ClassVar[str]
    option: ClassVar[str]
    encodes_text: ClassVar[bool] = True

    tokenizer_sha256: str | None = None  # the tokenizer file the plan was measured with (text shapes)
    tokenizer: Any = field(default=None, repr=False)  # loaded: the Hugging Face ``tokenizers.Tokenizer``
    encoder: Any = field(default=None, repr=False, compare=False)  # loaded: load_tokenizer's TokenEncoder of it

    def __post_init__(self) -> None:
        # the Hugging Face Tokenizer itself (load_tokenizer wraps it): the chats need its character offsets and the
        # pairs its post-processor, and it pickles (a collate's tokenize= goes to DataLoader workers); the wrapper,
        # where given, encodes whole columns through the compiled path (fast_chats, fast_pairs)
        # (held as the wrapper's LazyTokenizer, which stands in for it: parsed only where used)
        given = _handle(self.tokenizer)
        wrapper = self.tokenizer if given is not None else self.encoder
        if given is not None:
            object.__setattr__(self, "tokenizer", given)
        if _handle(wrapper) is not self.tokenizer or self.tokenizer is None:
            wrapper = None
        object.__setattr__(self, "encoder", wrapper)

    def __eq__(self, other: object) -> bool:
        """Return whether ``other`` is the same shape, with the same options and tokenizer object."""
        return (type(other) is type(self) and isinstance(other, FineTuneShape) and other.record() == self.record()
                and other.tokenizer is self.tokenizer)

    def __hash__(self) -> int:
        """Return a hash of the shape's options and its tokenizer's identity."""
        return hash((type(self).__name__, repr(sorted(self.record().items())), id(self.tokenizer)))

    # --- what a subclass defines ---------------------------------------------------------------------------------

    def columns(self) -> list[str]:
        """Return the input columns the shape reads."""
        raise NotImplementedError

    def encode_rows(self, table: pa.Table, rows: Rows) -> Encoded:
        """Return the ``Encoded`` of every row of ``table``, its columns there (``rows``: where they come from)."""
        raise NotImplementedError

    def record(self) -> dict:
        """Return what a manifest's ``options.fine_tune`` records of the shape (``{"shape": name, ...}``)."""
        raise NotImplementedError

    @classmethod
    def from_record(cls, record: dict, column: str | None) -> FineTuneShape:
        """Return the shape a manifest recorded (``record``: its ``fine_tune``; ``column``: the plan's ``--column``)."""
        raise NotImplementedError

    # --- what a subclass may refine ------------------------------------------------------------------------------

    def text_columns(self) -> list[str]:
        """Return the text columns among ``columns()`` (read as strings from CSV and JSON)."""
        return []

    def plan_column(self, given: str | None) -> str | None:
        """Return the ``--column`` a plan of this shape records, ``given`` the one the options name."""
        return given

    def stored_columns(self) -> tuple[str, ...]:
        """Return the columns ``--store`` takes to hold the samples' ids and labels as they are (none: they are
        made by a tokenizer, and ``--store-tokens`` stores them)."""
        return ()

    @property
    def stored_labels(self) -> str | None:
        """Return the column that holds the samples' labels as they are (None: a tokenizer's encoding makes them)."""
        return None

    def validate(self, has_tokenizer: bool) -> None:
        """Raise SortpackError (one line) for options of this shape that cannot work, before any file is read."""
        if self.encodes_text and not has_tokenizer:
            raise SortpackError(f"{self.option} needs --tokenizer tokenizer.json (the model's tokenizer)")

    def resolved(self, tokenizer_path: str | None) -> FineTuneShape:
        """Return the shape with what its files decide, to be recorded (the tokenizer's digest of a text shape)."""
        if not self.encodes_text or not tokenizer_path:
            return self
        return dataclasses.replace(self, tokenizer_sha256=file_digest(tokenizer_path))

    def check_tokenizer(self, path: str) -> None:
        """Raise SortpackError unless the tokenizer file at ``path`` has the bytes the plan recorded, so a tokenizer
        changed under its name is named, not the input."""
        digest = self.tokenizer_sha256
        if digest and file_digest(path) != digest:
            raise SortpackError(f"--tokenizer {path}: not the tokenizer the plan was measured with (the file changed "
                                f"since: sha256 {file_digest(path)[:12]}..., the plan's {digest[:12]}...)")

    def loaded(self, tokenizer: Any, chat_template: str | None = None, why: str | None = None) -> FineTuneShape:
        """Return the shape ready to encode with ``tokenizer`` (loaded; a shape of a template loads it too, from
        ``chat_template``, or says ``why`` it needs it)."""
        return dataclasses.replace(self, tokenizer=tokenizer)

    def loaded_from(self, tokenizer_path: str | None, recorded_name: str | None, chat_template: str | None,
                    why: str) -> FineTuneShape:
        """Return a plan's shape ready to encode again (``pack`` cutting samples it reads back): with the tokenizer
        at ``tokenizer_path``, checked by name against ``recorded_name`` (what the plan was measured with) and by
        digest, and the chat template at ``chat_template``; ``why`` names what needs them when one is missing."""
        if not self.encodes_text:
            return self
        if not tokenizer_path:
            raise SortpackError(f"{why} needs --tokenizer (the tokenizer.json the plan was measured with"
                                f"{f': {recorded_name}' if recorded_name else ''})")
        from ..specs import load_tokenizer

        check_recorded_file("--tokenizer", tokenizer_path, recorded_name, "the plan was measured with")
        self.check_tokenizer(tokenizer_path)
        return self.loaded(load_tokenizer(tokenizer_path, "--tokenizer"), chat_template, why)

    def check_roles(self, seen: frozenset[str]) -> None:
        """Raise SortpackError when the roles the samples hold (``seen``) leave nothing to train (chats only)."""

    # --- shared -----------------------------------------------------------------------------------------------------

    def encode(self, table: pa.Table, where: str | Rows) -> Encoded:
        """Return the ``Encoded`` of every row of ``table`` (``where``: its file, or its ``Rows``), one line naming
        the file where a column the shape reads is missing."""
        rows = rows_of(where)
        for name in self.columns():
            if name not in table.column_names:
                raise SortpackError(f"{rows.path}: no column {name!r} (columns: {', '.join(table.column_names)})")
        return self.encode_rows(table, rows)

    def __call__(self, item: dict) -> tuple[np.ndarray, np.ndarray]:
        """Return (ids, labels) of one dataset row (a dict of its columns): a collate's ``tokenize=``."""
        table = pa.Table.from_pylist([{c: item[c] for c in self.columns()}])
        enc = self.encode(table, "item")
        ids = enc.ids.values.to_numpy(zero_copy_only=False).astype(np.int64)
        labels = enc.labels.values.to_numpy(zero_copy_only=False).astype(np.int64)
        return ids, labels
