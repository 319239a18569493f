"""Collate helpers: a micro-batch's dataset items into padded or varlen torch tensors.

torch is imported only when a collate function runs. The helpers learn a micro-batch's shape
(``batch_size``, ``padded_size``, ``row_splits``) and step from the ``MicroBatch`` the dataset
passes through (``SourceDataset`` and ``PackedDataset`` do), and fall back to the items' own
lengths otherwise.
"""
from __future__ import annotations

import numpy as np

from .sampler import MicroBatch, Samples


class PackedDataset:
    """Wraps any map-style dataset so collate helpers receive the micro-batch's shape with its items.

    Parameters
    ----------
    dataset : map-style dataset
        Item ``i`` is sample id ``i``; ``__getitems__`` returns ``Samples`` carrying the ``MicroBatch``.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        """Return the wrapped dataset's length."""
        return len(self.dataset)

    def __getitem__(self, i):
        """Return the wrapped dataset's item ``i``."""
        return self.dataset[i]

    def __getitems__(self, ids) -> Samples:
        """Return the items of ``ids`` as ``Samples`` carrying the ``MicroBatch`` (when ``ids`` is one)."""
        return Samples([self.dataset[i] for i in ids], ids if isinstance(ids, MicroBatch) else None)


# --- collate helpers ---------------------------------------------------------------------
def _tokens(item, key, tokenize) -> np.ndarray:
    seq = tokenize(item) if tokenize is not None else item[key] if key is not None else item
    if isinstance(seq, (bytes, bytearray, memoryview)):
        return np.frombuffer(seq, dtype=np.uint8).astype(np.int64)
    if isinstance(seq, str):
        raise TypeError("collate got text: pass tokenize= (e.g. lambda s: s.encode()) or a key of token ids")
    if isinstance(seq, dict):
        raise TypeError(f"collate got a row with columns {sorted(seq)}: pass key= (a column of token ids) "
                        "or tokenize= (a function from the row to token ids)")
    return np.asarray(seq, dtype=np.int64).reshape(-1)


def _sequences(items, key, tokenize) -> list[np.ndarray]:
    """Return each item's token ids; stored ``input_ids`` come straight from the Arrow slice."""
    table = getattr(items, "table", None)
    if table is not None and tokenize is None and isinstance(key, str) and key in table.schema.names:
        import pyarrow as pa

        col = table.column(key)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if hasattr(col, "offsets") and hasattr(col, "values"):
            offsets = col.offsets.to_numpy()
            # a sliced list array's .values is the whole shard's buffer: convert only this slice
            values = col.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
            values = values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            offsets = offsets - offsets[0]
            return [values[offsets[j]:offsets[j + 1]] for j in range(len(offsets) - 1)]
    return [_tokens(it, key, tokenize) for it in items]


def _round_up(n: int, k: int | None) -> int:
    return -(-n // k) * k if k and k > 1 else n


class PadCollate:
    """Collate a micro-batch into a padded ``(batch_size, padded_size)`` batch (see ``pad_collate``).

    Parameters
    ----------
    pad_id : int
        The id written into padding.
    key : str, optional
        Take an item's token ids from ``item[key]``.
    tokenize : callable, optional
        Take an item's token ids from ``tokenize(item)`` (module level, so workers can pickle it).
    attn_mask : {None, "causal", "full"}
        Also return a per-sample (B, T, T) attention mask.
    pad_to_multiple : int, optional
        Without a known shape, round the longest item up to a multiple of this.
    """

    def __init__(self, pad_id: int = 0, key=None, tokenize=None, attn_mask: str | None = None,
                 pad_to_multiple: int | None = None):
        if attn_mask not in (None, "causal", "full"):
            raise ValueError(f"attn_mask must be None, 'causal' or 'full', not {attn_mask!r}")
        self.pad_id, self.key, self.tokenize = pad_id, key, tokenize
        self.attn_mask, self.pad_to_multiple = attn_mask, pad_to_multiple

    def __call__(self, items) -> dict:
        """Return input_ids, lengths, key_padding_mask, real, sample_ids (and attn_mask) tensors."""
        import torch

        seqs = _sequences(items, self.key, self.tokenize)
        n = len(seqs)
        mb = getattr(items, "microbatch", None)
        longest = max((len(s) for s in seqs), default=0)
        if mb is not None and mb.padded_size is not None:
            rows, width = max(int(mb.batch_size), n), int(mb.padded_size)
        else:
            rows, width = n, _round_up(longest, self.pad_to_multiple)
        ids = np.full((rows, width), self.pad_id, dtype=np.int64)
        lengths = np.zeros(rows, dtype=np.int64)
        for r, s in enumerate(seqs):
            k = min(len(s), width)  # a tokenizer longer than the index's size is cut to the shape
            ids[r, :k] = s[:k]
            lengths[r] = k
        positions = np.arange(width)
        valid = positions[None, :] < lengths[:, None]
        sample_ids = np.full(rows, -1, dtype=np.int64)
        if mb is not None:
            sample_ids[:n] = np.asarray(list(mb)[:n], dtype=np.int64)
        out = {
            "input_ids": torch.from_numpy(ids),
            "lengths": torch.from_numpy(lengths),
            "key_padding_mask": torch.from_numpy(~valid),
            "real": torch.from_numpy((np.arange(rows) < n) & (not getattr(mb, "repeat", False))),
            "sample_ids": torch.from_numpy(sample_ids),
        }
        if mb is not None:
            out["microbatch"] = mb.info()
        if self.attn_mask is not None:
            allowed = valid[:, None, :] & valid[:, :, None]
            if self.attn_mask == "causal":
                allowed &= np.tril(np.ones((width, width), dtype=bool))[None]
            # padding queries attend to themselves only, so no softmax row is empty (no NaN)
            allowed |= np.eye(width, dtype=bool)[None] & ~valid[:, :, None]
            out["attn_mask"] = torch.from_numpy(allowed)
        return out


def pad_collate(pad_id: int = 0, key=None, tokenize=None, attn_mask: str | None = None,
                pad_to_multiple: int | None = None) -> PadCollate:
    """Return a picklable collate_fn that pads a micro-batch to its ``(batch_size, padded_size)``.

    Items are token-id sequences, ``item[key]``, or ``tokenize(item)``. The result holds
    ``input_ids`` (B, T), ``lengths`` (B,), ``key_padding_mask`` (B, T; True = padding, as
    ``nn.MultiheadAttention``), ``real`` (B,; False for the index's padding slots, which are
    fully masked, and for every row of a micro-batch repeated to fill a step: skip those when
    evaluating), ``sample_ids`` (B,; -1 where unknown), ``microbatch`` (the ``MicroBatch.info()``
    dict: epoch, step, position, end, last, step_batch, step_tokens, repeat; pass the batch to
    ``sampler.consume``) and, with ``attn_mask="causal"`` or ``"full"``, ``attn_mask``
    (B, T, T; True = may attend, as ``F.scaled_dot_product_attention``).
    Without a known shape, T is the longest item rounded up to ``pad_to_multiple``.
    """
    return PadCollate(pad_id, key, tokenize, attn_mask, pad_to_multiple)


class VarlenCollate:
    """Collate a micro-batch into concatenated tokens with ``cu_seqlens`` (see ``varlen_collate``).

    Parameters
    ----------
    key : str, optional
        Take an item's token ids from ``item[key]``.
    tokenize : callable, optional
        Take an item's token ids from ``tokenize(item)``.
    pad_id : int
        The id that fills each packed row to ``padded_size`` (rows mode).
    """

    def __init__(self, key=None, tokenize=None, pad_id: int = 0):
        self.key, self.tokenize, self.pad_id = key, tokenize, pad_id

    def __call__(self, items) -> dict:
        """Return input_ids, position_ids, cu_seqlens, max_seqlen, seq_index, lengths and token_mask."""
        import torch

        seqs = _sequences(items, self.key, self.tokenize)
        mb = getattr(items, "microbatch", None)
        splits = getattr(mb, "row_splits", None)
        # segments: (sample position in the micro-batch or -1 for padding, tokens)
        segments: list[tuple[int, np.ndarray]] = []
        lengths = np.zeros(len(seqs), dtype=np.int64)
        if splits is not None and mb is not None and mb.padded_size is not None:
            width = int(mb.padded_size)
            for r in range(len(splits) - 1):
                room = width
                for j in range(splits[r], splits[r + 1]):
                    s = seqs[j][:room]  # a row longer than its packed length is cut
                    segments.append((j, s))
                    lengths[j] = len(s)
                    room -= len(s)
                if room:
                    segments.append((-1, np.full(room, self.pad_id, dtype=np.int64)))
        else:
            for j, s in enumerate(seqs):
                segments.append((j, s))
                lengths[j] = len(s)
        seg_len = np.array([len(s) for _, s in segments], dtype=np.int64)
        cu = np.zeros(len(segments) + 1, dtype=np.int32)
        np.cumsum(seg_len, out=cu[1:])
        total = int(cu[-1])
        ids = np.concatenate([s for _, s in segments]) if segments else np.zeros(0, dtype=np.int64)
        seg_of_token = np.repeat(np.arange(len(segments)), seg_len)
        positions = np.arange(total, dtype=np.int64) - cu[:-1].astype(np.int64)[seg_of_token]
        seq_index = np.array([j for j, _ in segments], dtype=np.int64)
        sample_ids = np.asarray(list(mb), dtype=np.int64) if mb is not None else np.full(len(seqs), -1)
        return {
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "position_ids": torch.from_numpy(positions),
            "cu_seqlens": torch.from_numpy(cu),
            "max_seqlen": int(seg_len.max(initial=0)),
            "seq_index": torch.from_numpy(seq_index),
            "lengths": torch.from_numpy(lengths),
            "token_mask": torch.from_numpy(seq_index[seg_of_token] >= 0 if total else np.zeros(0, bool)),
            "sample_ids": torch.from_numpy(sample_ids.astype(np.int64)),
            "real": torch.from_numpy(np.full(len(seqs), not getattr(mb, "repeat", False))),
            **({"microbatch": mb.info()} if mb is not None else {}),
        }


def varlen_collate(key=None, tokenize=None, pad_id: int = 0) -> VarlenCollate:
    """Return a picklable collate_fn for varlen attention kernels (no sample attends to another).

    ``input_ids`` is the micro-batch's samples concatenated; ``cu_seqlens`` (int32) bounds each
    segment and ``position_ids`` restart at 0 in each. With the index's ``row_splits`` (rows
    mode) every packed row is laid out whole and padded to ``padded_size``, so
    ``input_ids.view(batch_size, padded_size)`` gives the rows; padding forms its own
    segments (``seq_index`` -1, ``token_mask`` False). ``seq_index`` maps segments to the
    sample's place in the micro-batch, ``lengths`` gives each sample's tokens, ``real`` (one per
    sample) is False in a micro-batch repeated to fill a step, and ``microbatch`` is the
    ``MicroBatch.info()`` dict (as in ``pad_collate``).
    """
    return VarlenCollate(key, tokenize, pad_id)
