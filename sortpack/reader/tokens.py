"""A micro-batch's token ids as one flat int64 array and per-sample offsets (ragged), for the collate helpers.

From stored data (``Samples.table``, an Arrow slice of the plan's data shards) the ids come
straight from the Arrow buffers: the list column's offsets bound the micro-batch's tokens
in the child array, and only those tokens are read and widened to int64, with no Python
object per sample. Other items go through ``key``/``tokenize`` one by one.
"""
from __future__ import annotations

import numpy as np

from ..kernels.tokens import TokenView, token_view


def _item_tokens(item, key, tokenize) -> np.ndarray:
    seq = tokenize(item) if tokenize is not None else item[key] if key is not None else item
    if isinstance(seq, (bytes, bytearray, memoryview)):
        return np.frombuffer(seq, dtype=np.uint8).astype(np.int64)
    if isinstance(seq, str):
        raise TypeError("collate got text: pass tokenize= (e.g. lambda s: s.encode()) or a key of token ids")
    if isinstance(seq, dict):
        raise TypeError(f"collate got a row with columns {sorted(seq)}: pass key= (a column of token ids) "
                        "or tokenize= (a function from the row to token ids)")
    return np.asarray(seq, dtype=np.int64).reshape(-1)


def _arrow_chunk(arr) -> tuple[np.ndarray, np.ndarray] | None:
    """Return (values int64, offsets from 0) of a list or binary Arrow array's rows, or None for other types."""
    import pyarrow as pa

    from ..arrow_types import is_offset_binary, is_offset_list

    t = arr.type
    if is_offset_list(t):
        offsets = arr.offsets.to_numpy().astype(np.int64)
        lo, hi = int(offsets[0]), int(offsets[-1])
        child = arr.values.slice(lo, hi - lo)  # .values is the whole child array, not the slice's part
        if child.null_count:
            raise ValueError("collate: a token list holds nulls")
        values = child.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return values, offsets - lo
    if is_offset_binary(t):
        wide = pa.types.is_large_binary(t)
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[arr.offset:arr.offset + len(arr) + 1]
        offsets = offsets.astype(np.int64)
        lo, hi = int(offsets[0]), int(offsets[-1])
        values = np.frombuffer(bufs[2], dtype=np.uint8)[lo:hi].astype(np.int64) if hi > lo else np.zeros(0, np.int64)
        return values, offsets - lo
    return None


def _from_table(table, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    col = table.column(key)
    chunks = col.chunks if hasattr(col, "chunks") else [col]
    got = [_arrow_chunk(c) for c in chunks]
    parts = [p for p in got if p is not None]
    if not parts or len(parts) != len(got):
        return None
    if len(parts) == 1:
        return parts[0]
    values = np.concatenate([p[0] for p in parts])
    lengths = np.concatenate([np.diff(p[1]) for p in parts])
    return values, np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)


_LIST_OFFSETS: dict = {}  # Arrow type id of list / large_list -> the offsets' dtype (filled on first use)
_INT_VALUES: dict = {}  # Arrow type id of int32 / int64 -> the values' dtype


def _fill_types() -> None:
    import pyarrow as pa

    _LIST_OFFSETS.update({pa.list_(pa.int32()).id: np.dtype(np.int32),
                          pa.large_list(pa.int32()).id: np.dtype(np.int64)})
    _INT_VALUES.update({pa.int32().id: np.dtype(np.int32), pa.int64().id: np.dtype(np.int64)})


def stored_token_view(items, key) -> TokenView | None:
    """Return (values, offsets, ...): zero-copy numpy views of the stored token ids of ``items.table[key]``, or None.

    Sample j's ids are ``values[offsets[j]:offsets[j + 1]]`` (int32 or int64 as stored; the
    offsets index the list column's child array, as Arrow lays them out). None unless the
    column is one list (or large_list) of int32/int64 without a null id, in one chunk: the
    caller then takes ``ragged_tokens``, which handles every other case. ``TableSamples`` of
    a whole stored micro-batch answer from their shard's column without building the slice.
    """
    if not isinstance(key, str):
        return None
    view = getattr(items, "token_view", None)
    if view is not None:
        return view(key)
    table = getattr(items, "table", None)
    if table is None:
        return None
    i = table.schema.get_field_index(key)
    return None if i < 0 else list_token_view(table.column(i))


def list_token_view(col) -> TokenView | None:
    """Return the ``TokenView`` of an Arrow list<int32|int64> column without null ids: zero-copy views and addresses.

    None for any other type, a null id, or a ChunkedArray of more than one chunk.
    """
    if not hasattr(col, "buffers"):  # a Table's ChunkedArray
        if col.num_chunks != 1:
            return None
        col = col.chunk(0)
    if not _LIST_OFFSETS:
        _fill_types()
    off_dtype = _LIST_OFFSETS.get(col.type.id)
    if off_dtype is None:
        return None
    bufs = col.buffers()  # validity, offsets, the child's validity, the child's values
    if len(bufs) != 4 or bufs[2] is not None or bufs[3] is None:
        return None
    child = col.values
    vdtype = _INT_VALUES.get(child.type.id)
    if vdtype is None:
        return None
    offsets = np.frombuffer(bufs[1], dtype=off_dtype, count=len(col) + 1, offset=col.offset * off_dtype.itemsize)
    # the offsets count from the child's own start
    values = np.frombuffer(bufs[3], dtype=vdtype, count=child.offset + len(child))[child.offset:]
    return token_view(values, offsets)


def _cut_to_pieces(seqs: list[np.ndarray], ranges) -> list[np.ndarray]:
    """Return each tokenized text cut to its piece's token range (``--oversize split`` under ``--size tokens``)."""
    begin, end = ranges
    return [s[int(b):int(e)] for s, b, e in zip(seqs, begin, end)]


def _ids(seq) -> np.ndarray:
    return np.asarray(seq, dtype=np.int64).reshape(-1)


def _item_pair(item, key, tokenize, labels) -> tuple[np.ndarray, np.ndarray | None]:
    """Return one item's (token ids, labels or None): ``tokenize(item)`` may give (ids, labels) or a dict of both."""
    got = tokenize(item) if tokenize is not None else None
    if isinstance(got, tuple) and len(got) == 2:
        return _ids(got[0]), _ids(got[1])
    if isinstance(got, dict) and "input_ids" in got:
        return _ids(got["input_ids"]), None if got.get("labels") is None else _ids(got["labels"])
    if got is not None:
        return _item_tokens(got, None, None), None
    ids = _item_tokens(item, key, None)
    if labels is not None and key is not None and isinstance(item, dict) and item.get(labels) is not None:
        return ids, _ids(item[labels])
    return ids, None


def ragged_labeled(items, key=None, tokenize=None, labels=None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Return (values, offsets, label values or None): ``ragged_tokens`` with the labels aligned to the ids.

    Labels come from a stored list column ``labels`` beside ``key``, ``item[labels]`` beside
    ``item[key]``, or ``tokenize(item)`` giving ``(ids, labels)`` or ``{"input_ids", "labels"}``;
    None when no item has any. Raises ValueError when a sample's labels and ids differ in length.
    """
    table = getattr(items, "table", None)
    if table is not None and tokenize is None and isinstance(key, str) and key in table.schema.names:
        got = _from_table(table, key)
        if got is not None:
            lab = _from_table(table, labels) if isinstance(labels, str) and labels in table.schema.names else None
            if lab is not None and not np.array_equal(np.diff(lab[1]), np.diff(got[1])):
                raise ValueError(f"collate: the stored {labels!r} and {key!r} differ in length")
            return got[0], got[1], None if lab is None else lab[0]
    pairs = [_item_pair(it, key, tokenize, labels) for it in items]
    seqs = [p[0] for p in pairs]
    labs = [p[1] for p in pairs if p[1] is not None]
    if labs and len(labs) != len(seqs):
        raise ValueError("collate: some items have labels and some do not")
    if tokenize is not None and getattr(items, "token_ranges", None) is not None:
        seqs = _cut_to_pieces(seqs, items.token_ranges)
        labs = _cut_to_pieces(labs, items.token_ranges) if labs else labs
    counts = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = np.concatenate(seqs).astype(np.int64, copy=False) if seqs else np.zeros(0, np.int64)
    if not labs:
        return values, offsets, None
    bad = np.flatnonzero(np.fromiter(map(len, labs), dtype=np.int64, count=len(labs)) != counts)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"collate: item {i} has {len(labs[i])} labels for {int(counts[i])} token ids")
    return values, offsets, np.concatenate(labs).astype(np.int64, copy=False)


def ragged_tokens(items, key=None, tokenize=None) -> tuple[np.ndarray, np.ndarray]:
    """Return (values, offsets): the items' token ids one after another (int64) and where each starts (n + 1).

    Stored list or binary columns named by ``key`` (no ``tokenize``) are read from the Arrow
    buffers of ``items.table``; anything else is ``item[key]``, ``tokenize(item)`` or the item.
    """
    table = getattr(items, "table", None)
    if table is not None and tokenize is None and isinstance(key, str) and key in table.schema.names:
        got = _from_table(table, key)
        if got is not None:
            return got
    seqs = [_item_tokens(it, key, tokenize) for it in items]
    if tokenize is not None and getattr(items, "token_ranges", None) is not None:
        seqs = _cut_to_pieces(seqs, items.token_ranges)
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    if seqs:
        np.cumsum([len(s) for s in seqs], out=offsets[1:])
    values = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
    return values.astype(np.int64, copy=False), offsets
