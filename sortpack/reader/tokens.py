"""A micro-batch's token ids as one flat int64 array and per-sample offsets (ragged), for the collate helpers.

From stored data (``Samples.table``, an Arrow slice of the plan's data shards) the ids come
straight from the Arrow buffers: the list column's offsets bound the micro-batch's tokens
in the child array, and only those tokens are read and widened to int64, with no Python
object per sample. Other items go through ``key``/``tokenize`` one by one.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from ..kernels.tokens import TokenView, token_view
from .samples_contract import SamplesContract, as_samples


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


def stored_token_view(items: Any, key) -> TokenView | None:
    """Return (values, offsets, ...): zero-copy numpy views of the stored token ids of ``items.table[key]``, or None.

    Sample j's ids are ``values[offsets[j]:offsets[j + 1]]`` (int32 or int64 as stored; the
    offsets index the list column's child array, as Arrow lays them out). None unless the
    column is one list (or large_list) of int32/int64 without a null id, in one chunk: the
    caller then takes ``ragged_tokens``, which handles every other case. ``TableSamples`` of
    a whole stored micro-batch answer from their shard's column without building the slice.
    """
    if not isinstance(key, str):
        return None
    items = as_samples(items)
    view = items.token_view(key)
    if view is not None:
        return view
    table = items.table
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


def _doc_ids(items: SamplesContract, n: int) -> np.ndarray | None:
    """Return the sample id of each of the ``n`` items (int64), or None when the items do not say."""
    known = items.sample_ids
    if known is None:
        known = items.microbatch
    if known is None or len(known) != n:
        return None
    return np.asarray(known, dtype=np.int64).reshape(-1)


class TokenCache:
    """The token ids (and labels) of the last few long documents a split plan's pieces were cut from (one per dataset
    and process).

    A document ``--oversize split`` cut into K pieces is tokenized whole for each piece when
    the text is read back; its pieces sort together (equal sizes, one sample id), so they
    come in consecutive micro-batches, and keeping the ids of the last ``documents`` cut
    documents tokenizes each once per pass in plan order. Keys are ``(tokenize, sample id)``:
    ``SourceDataset`` owns the cache, so a sample id names one row.
    """

    def __init__(self, documents: int = 8):
        self.documents = max(1, int(documents))
        self._docs: OrderedDict = OrderedDict()

    def get(self, key) -> tuple[np.ndarray, np.ndarray | None] | None:
        """Return the (ids, labels or None) kept for ``key`` (None: not kept)."""
        got = self._docs.get(key)
        if got is not None:
            self._docs.move_to_end(key)
        return got

    def put(self, key, ids: tuple[np.ndarray, np.ndarray | None]) -> None:
        """Keep (ids, labels or None) for ``key``, dropping the least recently used beyond ``documents``."""
        self._docs[key] = ids
        self._docs.move_to_end(key)
        while len(self._docs) > self.documents:
            self._docs.popitem(last=False)


def _piece_tokens(items: SamplesContract, key, tokenize, ranges) -> tuple[np.ndarray, np.ndarray]:
    """Return (values, offsets) of each item's piece: ``_piece_pairs`` without the labels."""
    values, offsets, _ = _piece_pairs(items, key, tokenize, None, ranges)
    return values, offsets


def _piece_pairs(items: SamplesContract, key, tokenize, labels, ranges
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Return (values, offsets, label values or None) of each item's piece: its document tokenized once, cut to
    ``[begin, end)``.

    ``--oversize split`` under ``--size tokens`` without stored tokens: the pieces of one long
    document share its row, so the document is tokenized once per micro-batch (not once per
    piece: a document of K pieces cost K whole tokenizations), or once per pass with the
    dataset's ``TokenCache`` (``items.token_cache``), and every piece is cut from the result by
    one vectorised gather. A ``tokenize`` that gives labels (``(ids, labels)`` or a dict of
    both, as ``_item_pair`` reads them) has them cut with the ids.
    """
    n = len(items)
    begin, end = (np.asarray(r, dtype=np.int64) for r in ranges)
    ids = _doc_ids(items, n)
    if ids is None:  # no ids to tell documents apart: each item is its own
        first, inverse = np.arange(n), np.arange(n)
    else:
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    cache = items.token_cache if ids is not None and _hashable(tokenize) else None
    docs = []
    for j in first.tolist():
        if cache is None or ids is None:
            docs.append(_item_pair(items[j], key, tokenize, labels))
            continue
        doc = (tokenize, int(ids[j]))
        got = cache.get(doc)
        if got is None:
            got = _item_pair(items[j], key, tokenize, labels)
            if begin[j] > 0 or end[j] < len(got[0]):  # a piece of a longer document
                cache.put(doc, got)
        docs.append(got)
    with_labels = [d[1] is not None for d in docs]
    if any(with_labels) and not all(with_labels):
        raise ValueError("collate: some items have labels and some do not")
    for i, (tok, lab) in enumerate(docs):
        if lab is not None and len(lab) != len(tok):
            raise ValueError(f"collate: item {int(first[i])} has {len(lab)} labels for {len(tok)} token ids")
    doc_len = np.array([len(d[0]) for d in docs], dtype=np.int64)
    doc_start = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(doc_len, out=doc_start[1:])
    have = doc_len[inverse]
    lo = np.minimum(begin, have)
    hi = np.maximum(np.minimum(end, have), lo)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(hi - lo, out=offsets[1:])
    src = np.repeat(doc_start[:-1][inverse] + lo - offsets[:-1], hi - lo) + np.arange(offsets[-1], dtype=np.int64)

    def flat(k: int) -> np.ndarray:
        return np.concatenate([d[k] for d in docs]).astype(np.int64, copy=False) if docs else np.zeros(0, np.int64)

    return flat(0)[src], offsets, flat(1)[src] if docs and all(with_labels) else None


def _hashable(value) -> bool:
    """Return whether ``value`` can key a dict (a ``tokenize`` that cannot is not cached)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


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


def ragged_labeled(items: Any, key=None, tokenize=None, labels=None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Return (values, offsets, label values or None): ``ragged_tokens`` with the labels aligned to the ids.

    Labels come from a stored list column ``labels`` beside ``key``, ``item[labels]`` beside
    ``item[key]``, or ``tokenize(item)`` giving ``(ids, labels)`` or ``{"input_ids", "labels"}``;
    None when no item has any. A split plan's pieces (``items.token_ranges``) go through
    ``_piece_pairs``: each document tokenized once, its labels cut with its ids, whatever
    ``tokenize`` returns. Raises ValueError when a sample's labels and ids differ in length.
    """
    items = as_samples(items)
    table = items.table
    if table is not None and tokenize is None and isinstance(key, str) and key in table.schema.names:
        got = _from_table(table, key)
        if got is not None:
            lab = _from_table(table, labels) if isinstance(labels, str) and labels in table.schema.names else None
            if lab is not None and not np.array_equal(np.diff(lab[1]), np.diff(got[1])):
                raise ValueError(f"collate: the stored {labels!r} and {key!r} differ in length")
            return got[0], got[1], None if lab is None else lab[0]
    ranges = items.token_ranges if tokenize is not None else None
    if ranges is not None:  # pieces of a split plan: each document tokenized once, its labels cut with its ids
        return _piece_pairs(items, key, tokenize, labels, ranges)
    pairs = [_item_pair(it, key, tokenize, labels) for it in items]
    seqs = [p[0] for p in pairs]
    labs = [p[1] for p in pairs if p[1] is not None]
    if labs and len(labs) != len(seqs):
        raise ValueError("collate: some items have labels and some do not")
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


def ragged_tokens(items: Any, key=None, tokenize=None) -> tuple[np.ndarray, np.ndarray]:
    """Return (values, offsets): the items' token ids one after another (int64) and where each starts (n + 1).

    Stored list or binary columns named by ``key`` (no ``tokenize``) are read from the Arrow
    buffers of ``items.table``; anything else is ``item[key]``, ``tokenize(item)`` or the item.
    """
    items = as_samples(items)
    table = items.table
    if table is not None and tokenize is None and isinstance(key, str) and key in table.schema.names:
        got = _from_table(table, key)
        if got is not None:
            return got
    if tokenize is not None and items.token_ranges is not None:
        return _piece_tokens(items, key, tokenize, items.token_ranges)
    seqs = [_item_tokens(it, key, tokenize) for it in items]
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    if seqs:
        np.cumsum([len(s) for s in seqs], out=offsets[1:])
    values = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
    return values.astype(np.int64, copy=False), offsets


def check_planned(items: SamplesContract, view: TokenView) -> None:
    """Raise ``SortpackError`` when ``tokenize=`` gave other lengths than the ``--size tokens`` plan counted.

    Only items that say their plan counted tokens (``Samples.size_unit``, set by
    ``SourceDataset``) are checked: a split plan's pieces one by one (each must hold ``end -
    begin`` ids), another micro-batch by its total (the plan's ``tokens``, each sample cut at
    ``padded_size`` as the collate cuts it). A tokenizer file's own truncation or padding is
    the usual cause: the plan counts without them, ``tokenize`` at read time with them.
    """
    if items.size_unit != "tokens":
        return
    mb = items.microbatch
    offsets = np.asarray(view.offsets)
    lengths = np.diff(offsets)
    ranges = items.token_ranges
    if ranges is not None:
        want = np.asarray(ranges[1], dtype=np.int64) - np.asarray(ranges[0], dtype=np.int64)
        bad = np.flatnonzero(lengths != want)
        if bad.size:
            j = int(bad[0])
            ids = _doc_ids(items, len(lengths))
            where = f"sample {int(ids[j])}" if ids is not None else f"item {j}"
            _refuse(mb, f"{where}'s piece [{int(ranges[0][j])}, {int(ranges[1][j])}) got {int(lengths[j])} token "
                        f"ids from tokenize=, the plan counted {int(want[j])}")
        return
    if mb is None or mb.microbatch < 0 or not mb.tokens:
        return
    cap = mb.padded_size
    got = int(np.minimum(lengths, cap).sum()) if cap else int(offsets[-1] - offsets[0])
    if got != int(mb.tokens):
        _refuse(mb, f"tokenize= gave {got} tokens, the plan counted {int(mb.tokens)}")


def _refuse(mb, what: str) -> None:
    from ..errors import SortpackError

    raise SortpackError(
        f"micro-batch {'?' if mb is None else mb.microbatch}: {what} (--size tokens): tokenize must return the ids the "
        "plan was counted with; a tokenizer file's own truncation or padding (tokenizer.json \"truncation\", "
        "\"padding\") changes them: turn both off, tok.no_truncation() and tok.no_padding(), or store the tokens "
        "(--store-tokens)")
