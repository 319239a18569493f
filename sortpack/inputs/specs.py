"""Size and difficulty SPECs: how a per-sample number is computed from a record batch.

The size kinds (``length``, ``bytes``, ``words``, ``tokens``: ``size_kinds.SIZE_KINDS``, one
row each; the media kinds, ``image_tokens:COL:SCHEME[:K=V,...]`` and the like, which name
their column), ``column:NAME[*SCALE]``, ``python:MODULE:FUNC``. Everything is vectorised with
pyarrow.compute or numpy except the tokenizer and user functions.
"""
from __future__ import annotations

import importlib
import math
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..arrow_types import plain_column
from ..errors import SortpackError, one_line
from .size_kinds import SIZE_KINDS, spec_forms

_COLUMN_RE = re.compile(r"^column:([^*]+?)(?:\*([-+0-9.eE]+))?$")


@dataclass(frozen=True)
class Spec:
    """A parsed SPEC: ``kind`` plus the column, scale or function it needs."""

    kind: str  # a size kind (size_kinds.SIZE_KINDS), column or python
    column: str | None = None
    scale: float | None = None
    func: str | None = None
    text: str = ""
    settings: Any = None  # a media kind's settings (size_kinds.SizeKind.settings)

    def columns(self) -> list[str] | None:
        """Return the input columns this spec reads (None: every column)."""
        return None if self.kind == "python" or self.column is None else [self.column]


def parse_spec(text: str, column: str | None, option: str) -> Spec:
    """Return the Spec for ``text`` (``option`` names the CLI option in errors)."""
    head, _, rest = text.partition(":")
    media = SIZE_KINDS.get(head)
    if media is not None and media.settings is not None:
        if not rest:
            raise SortpackError(f"{option} {text}: name the column, {media.spelling}")
        named, settings = media.settings(rest, f"{option} {text}")
        return Spec(head, column=named, text=text, settings=settings)
    if text in SIZE_KINDS:
        if not column:
            raise SortpackError(f"{option} {text} needs --column (the text, list or binary column)")
        return Spec(text, column=column, text=text)
    m = _COLUMN_RE.match(text)
    if m:
        scale = None
        if m.group(2) is not None:
            try:
                scale = float(m.group(2))
            except ValueError:
                raise SortpackError(f"{option} {text}: bad scale {m.group(2)!r}") from None
            if not math.isfinite(scale) or scale <= 0:
                raise SortpackError(f"{option} {text}: scale must be a positive number")
        return Spec("column", column=m.group(1), scale=scale, text=text)
    if text.startswith("python:"):
        parts = text.split(":")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            raise SortpackError(f"{option} {text}: expected python:MODULE:FUNC")
        return Spec("python", func=text[len("python:"):], text=text)
    raise SortpackError(
        f"{option} {text!r}: expected {', '.join(spec_forms())}, column:NAME[*SCALE] or python:MODULE:FUNC")


def load_function(spec: Spec) -> Callable:
    """Return the user function a ``python:MODULE:FUNC`` spec names.

    Modules are found in the current directory first (as ``python -m`` does; the
    ``sortpack`` console script's own sys.path lacks it), then on sys.path.
    """
    assert spec.func is not None, "load_function takes a python:MODULE:FUNC spec"
    module, func = spec.func.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return getattr(importlib.import_module(module), func)
    except SystemExit as exc:
        raise SortpackError(f"{spec.text}: importing {module} called sys.exit({exc.code!r})") from None
    except Exception as exc:  # noqa: BLE001 - importing user code may raise anything
        where = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and module.startswith(exc.name):
            where = f"; looked in the current directory {cwd} and sys.path {os.pathsep.join(sys.path)}"
        raise SortpackError(f"{spec.text}: cannot load {module}.{func} "
                            f"({type(exc).__name__}: {one_line(exc)}{where})") from None


def load_tokenizer(path: str | None, option: str = "--size"):
    """Return a ``fast_tokens.TokenEncoder`` of a tokenizer.json file, for counting (a ``tokenizers.Tokenizer`` too).

    The file's truncation and padding are switched off: a model's tokenizer.json often
    truncates and pads to a fixed length, which would make every sample measure the same.
    Its ids come from tiktoken where that gives exactly the file's ids (``inputs.fast_tokens``).
    """
    if not path:
        raise SortpackError(f"{option} tokens needs --tokenizer tokenizer.json")
    try:
        from tokenizers import Tokenizer  # noqa: F401 - needed whichever encoder runs: checked before any work
    except ImportError:
        from .fast_tokens import NEEDS_TOKENIZERS

        raise SortpackError(NEEDS_TOKENIZERS) from None
    from .fast_tokens import LazyTokenizer, TokenEncoder

    key = _tokenizer_key(path)
    if key is None:
        return TokenEncoder(None, path)
    with _TOKENIZERS_LOCK:
        if key not in _TOKENIZERS:
            _TOKENIZERS.clear()  # the latest file only: a process encodes with one tokenizer
            _TOKENIZERS[key] = LazyTokenizer(path)
        # a job loads it for its sizes and its store: one parse, where first needed
        return TokenEncoder(_TOKENIZERS[key], path)


_TOKENIZERS: dict[tuple, Any] = {}  # _tokenizer_key -> the LazyTokenizer of that file
_TOKENIZERS_LOCK = threading.Lock()


def _tokenizer_key(path: str) -> tuple | None:
    """Return what identifies a tokenizer file's bytes (None: it cannot be read)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path), st.st_mtime_ns, st.st_size


class RowError(SortpackError):
    """A value a SPEC cannot measure: its row of the table measured, and what is wrong (``at`` names its file row)."""

    def __init__(self, where: str, row: int, detail: str):
        super().__init__(f"{where}: row {row} of the rows read: {detail}")
        self.where, self.row, self.detail = where, row, detail

    def at(self, row0: int, name_row: Callable[[int], str] | None = None) -> SortpackError:
        """Return the error naming the row of the file (the table measured began at its row ``row0``)."""
        row = row0 + self.row
        return SortpackError(f"{self.where}: {name_row(row) if name_row else f'row {row}'}: {self.detail}")


def _column(table: pa.Table, name: str, where: str, nulls: bool = False) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise SortpackError(f"{where}: no column {name!r} (columns: {', '.join(table.column_names)})")
    col = table.column(name)
    if col.null_count and not nulls:
        raise SortpackError(f"{where}: column {name!r} has {col.null_count} null values")
    return plain_column(col)


def _media(spec: Spec, table: pa.Table, where: str) -> np.ndarray:
    """Return a media kind's count per row; a value without a size is a ``RowError``."""
    from .media.values import MediaError

    assert spec.column is not None, "a media kind names its column"
    col = _column(table, spec.column, where, nulls=True)  # a null image or clip is none
    kind = SIZE_KINDS[spec.kind]
    try:
        counts = kind.measure(col, spec.settings, where)
    except MediaError as exc:
        raise RowError(where, exc.row, f"column {spec.column!r}: {exc.detail}") from None
    if counts is None:
        raise SortpackError(f"{where}: column {spec.column!r} is {col.type}; {spec.kind} needs {kind.takes}")
    return counts


def _to_numpy(arr) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr.to_numpy(zero_copy_only=False)


def evaluate(spec: Spec, table: pa.Table, where: str, tokenizer=None, func=None,
             special_tokens: bool = True) -> np.ndarray:
    """Return the spec's value per row of ``table`` (int64, or float64 for scaled/float columns).

    ``where`` (file name) prefixes error messages; ``special_tokens`` says whether ``tokens``
    counts the tokens the tokenizer's post-processor adds ([CLS], [SEP], BOS/EOS).
    """
    if spec.kind == "python":
        # to_batches() of a zero-row table is empty: build the empty batch so the function
        # always receives a RecordBatch
        batches = table.combine_chunks().to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
        try:
            out = func(batch)
            if isinstance(out, (pa.Array, pa.ChunkedArray)):
                out = out.to_numpy(zero_copy_only=False)
            values = np.asarray(out)
        except SystemExit as exc:
            raise SortpackError(f"{where}: {spec.text} called sys.exit({exc.code!r})") from None
        except Exception as exc:  # noqa: BLE001 - user code may raise anything
            raise SortpackError(f"{where}: {spec.text} raised {type(exc).__name__}: "
                                f"{one_line(exc)}") from None
        if values.shape != (table.num_rows,):
            raise SortpackError(f"{where}: {spec.text} returned {values.shape[0] if values.ndim else 'a scalar'}"
                                f" values for {table.num_rows} rows")
        return _numeric(values, where, spec.text)
    assert spec.column is not None, "every kind but python names its column"
    if spec.settings is not None:
        return _media(spec, table, where)
    col = _column(table, spec.column, where)
    t = col.type
    if spec.kind == "column":
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            raise SortpackError(f"{where}: column {spec.column!r} is {t}, not numeric ({spec.text})")
        values = _to_numpy(col)
        if spec.scale is not None:
            values = values.astype(np.float64) * spec.scale
        return _numeric(values, where, spec.text)
    kind = SIZE_KINDS[spec.kind]
    counts = kind.measure(col, tokenizer, special_tokens)
    if counts is None:
        raise SortpackError(f"{where}: column {spec.column!r} is {t}; {spec.kind} needs {kind.takes}")
    return counts


def _numeric(values: np.ndarray, where: str, what: str) -> np.ndarray:
    if values.dtype == object:
        raise SortpackError(f"{where}: {what} gave non-numeric or null values")
    if values.dtype.kind == "b":
        values = values.astype(np.int64)
    if values.dtype.kind == "f":
        bad = ~np.isfinite(values)
        if bad.any():
            raise SortpackError(f"{where}: {what} has {int(bad.sum())} NaN or infinite values")
        return values.astype(np.float64, copy=False)
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    raise SortpackError(f"{where}: {what} gave values of type {values.dtype}, not numbers")


def as_size(values: np.ndarray, where: str, what: str) -> np.ndarray:
    """Return values as non-negative int64 sizes (floats rounded up), or raise."""
    if values.size and values.min() < 0:
        raise SortpackError(f"{where}: {what} has {int((values < 0).sum())} negative values")
    if values.dtype.kind == "f":
        if values.size and values.max() >= 2**62:
            raise SortpackError(f"{where}: {what} has values too large for a size")
        # 0.07 * 100 is 7.000000000000001 in binary floating point: a value within float
        # noise of an integer is that integer, anything else rounds up
        nearest = np.rint(values)
        noise = np.abs(values - nearest) <= 1e-9 * np.maximum(1.0, np.abs(values))
        values = np.where(noise, nearest, np.ceil(values)).astype(np.int64)
    return values


def as_difficulty(values: np.ndarray, where: str, what: str) -> np.ndarray:
    """Return values as a difficulty (int64 or float64), refusing negative values."""
    if values.size and values.min() < 0:
        raise SortpackError(f"{where}: {what} has {int((values < 0).sum())} negative values")
    return values
