"""Which Arrow types sortpack reads as text, bytes and lists, and their plain (non-view) forms.

Every test of a column's type goes through here, so a SPEC, the stored-data writer and the
reader agree on what counts as text, binary or a list. The ``offset`` predicates name the
types whose values are addressed by an offsets buffer (the layouts read byte-wise).
"""
from __future__ import annotations

import pyarrow as pa


def _has(t: pa.DataType, *tests: str) -> bool:
    """Return whether any named ``pa.types`` test holds (tests this pyarrow lacks are False)."""
    return any(getattr(pa.types, name, lambda _: False)(t) for name in tests)


def is_text(t: pa.DataType) -> bool:
    """Return whether ``t`` is a string type (string or large_string)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def is_offset_binary(t: pa.DataType) -> bool:
    """Return whether ``t`` is binary or large_binary (values addressed by offsets)."""
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def is_binary(t: pa.DataType) -> bool:
    """Return whether ``t`` is a binary type (binary, large_binary or fixed_size_binary)."""
    return is_offset_binary(t) or pa.types.is_fixed_size_binary(t)


def is_offset_bytes(t: pa.DataType) -> bool:
    """Return whether ``t`` is a string or binary type whose values are addressed by offsets."""
    return is_text(t) or is_offset_binary(t)


def is_offset_list(t: pa.DataType) -> bool:
    """Return whether ``t`` is list or large_list (values addressed by offsets)."""
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def is_list(t: pa.DataType) -> bool:
    """Return whether ``t`` is a list type: list, large_list, fixed_size_list or a list view.

    List views count as they are: pyarrow's cast of a list view to a list gives a broken
    array, and ``list_value_length`` takes views directly.
    """
    return is_offset_list(t) or pa.types.is_fixed_size_list(t) or _has(t, "is_list_view", "is_large_list_view")


def plain_type(t: pa.DataType) -> pa.DataType:
    """Return the type a column of type ``t`` is handled as: dictionary values, views as large types.

    The string kernels have no view or dictionary variants: polars writes string_view to
    Arrow IPC, pandas categoricals arrive dictionary-encoded.
    """
    if pa.types.is_dictionary(t):
        t = t.value_type
    if _has(t, "is_string_view"):
        return pa.large_string()
    if _has(t, "is_binary_view"):
        return pa.large_binary()
    return t


def plain_column(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Return ``col`` cast to its ``plain_type`` (itself when it already is plain)."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    target = plain_type(col.type)
    return col if target == col.type else col.cast(target)


def fixed_width(t: pa.DataType) -> int:
    """Return the byte width of a fixed-width type (0 when the type is not one, or is bit-packed or a dictionary)."""
    if pa.types.is_boolean(t) or pa.types.is_null(t) or pa.types.is_dictionary(t):
        return 0
    if pa.types.is_fixed_size_binary(t):
        return int(t.byte_width)
    try:
        bits = t.bit_width
    except ValueError:
        return 0
    return bits // 8 if bits % 8 == 0 else 0
