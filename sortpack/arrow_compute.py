"""The Arrow compute functions sortpack calls, by name, without loading ``pyarrow.compute``.

``import pyarrow.compute`` makes a Python wrapper, docstring and signature included, for each
of Arrow's ~290 functions: about 30 ms of CPU in every rank of every job (a tenth of a small
run's whole process), though a job calls a dozen of them. Those wrappers call
``pyarrow._compute.call_function``, which loads in about 3 ms; here each function sortpack uses
calls it with the same arguments and options. A pyarrow without that module serves the same
names from ``pyarrow.compute``. Array methods such as ``Array.take``, ``Array.fill_null`` or
``Array.cast`` load ``pyarrow.compute`` themselves, so the hot paths call the functions here.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

try:
    from pyarrow import _compute as _c
except ImportError:  # pragma: no cover - every pyarrow since 1.0 has it; the public module holds the same
    import pyarrow.compute as _c


def _call(name: str, *args: Any, options: Any = None) -> Any:
    return _c.call_function(name, list(args), options)


def binary_length(values: Any) -> Any:
    """Return the bytes of each string or binary value (null where null)."""
    return _call("binary_length", values)


def utf8_length(values: Any) -> Any:
    """Return the code points of each string (null where null)."""
    return _call("utf8_length", values)


def list_value_length(values: Any) -> Any:
    """Return the elements of each list (null where null)."""
    return _call("list_value_length", values)


def list_flatten(values: Any) -> Any:
    """Return the values of the lists, one level down, in order."""
    return _call("list_flatten", values)


def list_slice(values: Any, start: int, stop: int | None = None) -> Any:
    """Return each list's elements from ``start`` to ``stop``."""
    return _call("list_slice", values, options=_c.ListSliceOptions(start, stop))


def equal(left: Any, right: Any) -> Any:
    """Return where ``left == right``."""
    return _call("equal", left, right)


def not_equal(left: Any, right: Any) -> Any:
    """Return where ``left != right``."""
    return _call("not_equal", left, right)


def is_valid(values: Any) -> Any:
    """Return where each value is not null."""
    return _call("is_valid", values)


def is_null(values: Any) -> Any:
    """Return where each value is null."""
    return _call("is_null", values)


def if_else(cond: Any, left: Any, right: Any) -> Any:
    """Return ``left`` where ``cond``, else ``right``."""
    return _call("if_else", cond, left, right)


def any_true(values: Any) -> bool:
    """Return whether any value is true (nulls skipped)."""
    return bool(_call("any", values).as_py())


def fill_null(values: Any, fill_value: Any) -> Any:
    """Return ``values`` with each null replaced by ``fill_value`` (cast to their type, as ``pyarrow.compute``)."""
    if not isinstance(fill_value, (pa.Array, pa.ChunkedArray, pa.Scalar)):
        fill_value = pa.scalar(fill_value, type=values.type)
    elif values.type != fill_value.type:
        fill_value = pa.scalar(fill_value.as_py(), type=values.type)
    return _call("coalesce", values, fill_value)


def binary_join(lists: Any, separator: str) -> Any:
    """Return each list of strings joined by ``separator``."""
    return _call("binary_join", lists, separator)


def binary_join_element_wise(*strings: Any) -> Any:
    """Return the strings of each row joined by the last argument (a null anywhere gives null)."""
    return _call("binary_join_element_wise", *strings)


def utf8_trim(values: Any, characters: str) -> Any:
    """Return each string without the given characters at either end."""
    return _call("utf8_trim", values, options=_c.TrimOptions(characters))


def utf8_slice_codeunits(values: Any, start: int, stop: int) -> Any:
    """Return each string's code points from ``start`` to ``stop``."""
    return _call("utf8_slice_codeunits", values, options=_c.SliceOptions(start, stop))


def ends_with(values: Any, pattern: str) -> Any:
    """Return where each string ends with ``pattern``."""
    return _call("ends_with", values, options=_c.MatchSubstringOptions(pattern))


def match_substring(values: Any, pattern: str) -> Any:
    """Return where each string holds ``pattern``."""
    return _call("match_substring", values, options=_c.MatchSubstringOptions(pattern))


def match_substring_regex(values: Any, pattern: str) -> Any:
    """Return where each string matches the regular expression ``pattern`` (RE2) somewhere."""
    return _call("match_substring_regex", values, options=_c.MatchSubstringOptions(pattern))


def utf8_split_whitespace(values: Any) -> Any:
    """Return each string split at every run of Unicode whitespace."""
    return _call("utf8_split_whitespace", values)


def split_pattern(values: Any, pattern: str) -> Any:
    """Return each string split at every ``pattern``."""
    return _call("split_pattern", values, options=_c.SplitPatternOptions(pattern))


def is_in(values: Any, value_set: pa.Array) -> Any:
    """Return where each value is one of ``value_set`` (null where null)."""
    return _call("is_in", values, options=_c.SetLookupOptions(value_set))


def index_in(values: Any, value_set: pa.Array) -> Any:
    """Return each value's position in ``value_set`` (null where absent)."""
    return _call("index_in", values, options=_c.SetLookupOptions(value_set))


def unique(values: Any) -> Any:
    """Return the distinct values, in the order they first appear."""
    return _call("unique", values)


def take(values: Any, indices: Any) -> Any:
    """Return the values at ``indices``, in that order."""
    return _call("take", values, indices)


def filter_where(values: Any, mask: Any) -> Any:
    """Return the values where ``mask`` is true."""
    return _call("filter", values, mask)


def cast(values: Any, target: pa.DataType) -> Any:
    """Return ``values`` as ``target`` (a safe cast: one that would lose data raises)."""
    return _call("cast", values, options=_c.CastOptions.safe(target))
