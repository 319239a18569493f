"""``varlen_collate``: a micro-batch's documents one after another with ``cu_seqlens`` (and ``hf_inputs``).

The layout (which segment holds which document, a packed row's padding) is ``segments.py``'s;
one compiled pass writes every per-token array.
"""
from __future__ import annotations

import numpy as np

from ..kernels import varlen_tokens
from ..kernels.tokens import BatchKernels, Fill, RowMarks, TokenView, batch_kernels
from .collate_common import (
    _TENSORS,
    IGNORE_INDEX,
    LABELS_ONLY,
    CollateBase,
    is_repeat,
    known_ids,
    mask_labels,
    sample_ids,
    tensor_types,
)
from .samples_contract import SamplesContract
from .segments import Segments, segments


class VarlenCollate(CollateBase):
    """Collate a micro-batch into concatenated tokens with ``cu_seqlens`` (see ``varlen_collate``).

    Parameters
    ----------
    key : str, optional
        Take an item's token ids from ``item[key]``.
    tokenize : callable, optional
        Take an item's token ids from ``tokenize(item)``.
    pad_id : int
        The id that fills each packed row to ``padded_size`` (rows mode) and each padded document.
    position_ids_start : int
        The position id of every document's first token (``padding_idx + 1``, usually 2, for
        RoBERTa-like models; 0 otherwise).
    pad_to_multiple : int, optional
        Pad every document to a multiple of this (context parallelism: 2 x CP).
    labels : str, optional
        The stored column (or item key) of the labels aligned to the ids (-100: no target).
    source_ids : bool
        Also return each token's source id (a mixture plan's; -1 at padding).
    flex_block_size : int, optional
        Also return the block metadata of the causal document mask, in tiles of this size.
    """

    def __init__(self, key=None, tokenize=None, pad_id: int = 0, position_ids_start: int = 0,
                 pad_to_multiple: int | None = None, labels: str | None = "labels", *, source_ids: bool = False,
                 flex_block_size: int | None = None):
        if pad_to_multiple is not None and int(pad_to_multiple) < 1:
            raise ValueError(f"pad_to_multiple must be a positive integer, not {pad_to_multiple!r}")
        self._asked(source_ids, flex_block_size)
        self.key, self.tokenize, self.pad_id = key, tokenize, pad_id
        self.position_ids_start = int(position_ids_start)
        self.pad_to_multiple = int(pad_to_multiple) if pad_to_multiple else None
        self.labels = labels

    def __call__(self, items) -> dict:
        """Return input_ids, labels, position_ids, cu_seqlens, seq_idx, the Hugging Face keys, lengths and masks."""
        items, view, given = self._read(items)
        mb = items.microbatch
        kernels = batch_kernels()
        rows = mb is not None and mb.row_splits is not None and mb.padded_size is not None
        if kernels is not None and not rows and not (self.pad_to_multiple and self.pad_to_multiple > 1):
            out = self._compiled(kernels, view, items)  # one segment per sample: the usual layout
            if given is not None:
                kept = out["lengths"].numpy()
                cu = np.concatenate(([0], np.cumsum(kept)))
                mask_labels(out["labels"].numpy(), varlen_tokens(
                    given.values, given.offsets, (cu, kept, np.arange(len(kept), dtype=np.int64)), LABELS_ONLY)[0])
        else:
            out = self._laid_out(view, given, items)
        if mb is not None:
            out["microbatch"] = mb.info()
        self._extras(out, mb, out["token_mask"].numpy(), lambda: _bounds(out))
        return out

    def _laid_out(self, view: TokenView, given: TokenView | None, items: SamplesContract) -> dict:
        """Return the batch of ``segments``' layout (rows, or documents padded to ``pad_to_multiple``), in one pass."""
        import torch

        mb = items.microbatch
        full = np.diff(view.offsets).astype(np.int64, copy=False)
        layout = segments(full, mb, self.pad_to_multiple)
        cu = np.zeros(len(layout.length) + 1, dtype=np.int64)
        np.cumsum(layout.length, out=cu[1:])
        laid = (cu, layout.real, layout.sample)
        # one pass (compiled) writes every per-token array
        ids, labels, position_ids, seg_of, token_mask = varlen_tokens(
            view.values, view.offsets, laid, Fill(self.pad_id, IGNORE_INDEX, self.position_ids_start))
        if given is not None:
            mask_labels(labels, varlen_tokens(given.values, given.offsets, laid, LABELS_ONLY)[0])
        cu32 = torch.from_numpy(cu.astype(np.int32))
        max_len = int(layout.length.max(initial=0))
        out = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
               "position_ids": torch.from_numpy(position_ids), "cu_seqlens": cu32, "max_seqlen": max_len,
               "seq_index": torch.from_numpy(layout.sample), "seq_idx": torch.from_numpy(seg_of),
               "cu_seq_lens_q": cu32, "cu_seq_lens_k": cu32, "max_length_q": max_len, "max_length_k": max_len,
               "lengths": torch.from_numpy(_kept(layout, len(full))), "token_mask": torch.from_numpy(token_mask),
               "sample_ids": torch.from_numpy(sample_ids(mb, len(full), items)),
               "real": torch.from_numpy(np.full(len(full), not is_repeat(mb)))}
        if self.pad_to_multiple:
            # Transformer Engine's THD layout: cu_seqlens counts real tokens, cu_seqlens_padded bounds the tensor
            real_cu = np.zeros(len(layout.length) + 1, dtype=np.int32)
            np.cumsum(layout.real, out=real_cu[1:])
            out["cu_seqlens"], out["cu_seqlens_padded"] = torch.from_numpy(real_cu), cu32
            out["max_seqlen"] = int(layout.real.max(initial=0))
        if layout.width is not None:
            out["row_shape"] = (int(cu[-1]) // layout.width, layout.width)
        return out

    def _compiled(self, kernels: BatchKernels, view: TokenView, items: SamplesContract) -> dict:
        """Return the batch of one segment per sample, written by one compiled call into tensors torch allocated.

        The same batch as ``segments``' layout without rows or ``pad_to_multiple`` (each sample
        cut to the micro-batch's ``padded_size``), with as few torch calls as the outputs allow.
        """
        mb = items.microbatch
        n = len(view.offsets) - 1
        room = int(view.offsets[n]) - int(view.offsets[0]) if n > 0 else 0  # tokens before any cut
        long, flag, int32 = _TENSORS or tensor_types()
        ids, labels, positions, seq_idx = long(room), long(room), long(room), int32(room)
        mask, cu, lengths, seq_index = flag(room), int32(n + 1), long(n), long(n)
        sample_id, real = long(n), flag(n)
        cap = None if mb is None or mb.padded_size is None else int(mb.padded_size)
        total, longest = kernels.varlen_into(
            view, cap, Fill(self.pad_id, IGNORE_INDEX, self.position_ids_start),
            RowMarks(known_ids(mb, n, items), not is_repeat(mb)),
            (ids.data_ptr(), labels.data_ptr(), positions.data_ptr(), seq_idx.data_ptr(), mask.data_ptr(),
             cu.data_ptr(), lengths.data_ptr(), seq_index.data_ptr(), sample_id.data_ptr(), real.data_ptr()))
        if total < room:  # a sample longer than the plan's shape was cut
            ids, labels, positions, seq_idx, mask = (t[:total] for t in (ids, labels, positions, seq_idx, mask))
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "cu_seqlens": cu, "max_seqlen": longest,
                "seq_index": seq_index, "seq_idx": seq_idx, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
                "max_length_q": longest, "max_length_k": longest, "lengths": lengths, "token_mask": mask,
                "sample_ids": sample_id, "real": real}


def _bounds(out: dict) -> tuple[np.ndarray, int, int]:
    """Return (document boundaries, rows, row length) of a varlen batch: its rows, else one row of every token."""
    rows, width = out.get("row_shape", (1, len(out["input_ids"])))
    return out.get("cu_seqlens_padded", out["cu_seqlens"]).numpy(), rows, width


def _kept(layout: Segments, n: int) -> np.ndarray:
    """Return the tokens each of the ``n`` samples has in ``layout`` (as laid out, its padding to K not counted)."""
    if layout.width is None:  # one segment per sample, in order
        return layout.real
    doc = layout.sample >= 0
    kept = np.zeros(n, dtype=np.int64)
    kept[layout.sample[doc]] = layout.real[doc]
    return kept


def varlen_collate(key=None, tokenize=None, pad_id: int = 0, position_ids_start: int = 0,
                   pad_to_multiple: int | None = None, labels: str | None = "labels", *, source_ids: bool = False,
                   flex_block_size: int | None = None) -> VarlenCollate:
    """Return a picklable collate_fn for packed documents: varlen kernels, document masks, Hugging Face models.

    ``input_ids`` (1-D) is the micro-batch's samples (documents) one after another; a stored
    list column named by ``key`` is read straight from the Arrow buffers. ``cu_seqlens``
    (int32) bounds each segment and ``max_seqlen`` is the longest; ``position_ids`` restart
    at ``position_ids_start`` in every segment; ``labels`` are ``input_ids`` with -100 at each
    document's first position and at padding, aligned to the inputs (Hugging Face causal LMs
    shift them; ``DataCollatorWithFlattening``'s convention). The Hugging Face padding-free
    keys are there too: ``cu_seq_lens_q``/``cu_seq_lens_k`` (= ``cu_seqlens``),
    ``max_length_q``/``max_length_k`` (= ``max_seqlen``) and ``seq_idx`` (int32, the
    segment of each token); ``hf_inputs(batch)`` gives them the model's shapes.

    With the index's ``row_splits`` (rows mode) every packed row is laid out whole and padded
    to ``padded_size``, so ``input_ids.view(batch["row_shape"])`` gives the rows; a row's
    padding is its own segment (``seq_index`` -1, ``token_mask`` False). ``seq_index`` maps
    segments to the sample's place in the micro-batch, ``lengths`` gives each sample's tokens
    (as laid out), ``real`` (one per sample) is False in a micro-batch repeated to fill a
    step, and ``microbatch`` is the ``MicroBatch.info()`` dict (as in ``pad_collate``).

    ``pad_to_multiple=K`` pads every document to a multiple of K tokens (context
    parallelism splits each sequence into 2 x CP chunks: K = 2 x CP), rows or not, in
    Transformer Engine's THD convention: ``cu_seqlens`` then counts real tokens,
    ``cu_seqlens_padded`` (and ``cu_seq_lens_q/k``) bound the padded documents in
    ``input_ids``; positions run on through a document's padding, which has no labels.

    Labels given with the data (a stored ``labels`` column, ``item[labels]``, or
    ``tokenize(item)`` returning ``(ids, labels)``: see ``pad_collate``) are laid out as the
    ids are, still -100 at padding and at each document's first position.

    ``source_ids=True`` (a mixture plan) adds ``source_ids`` (one per token, int64): the
    micro-batch's source, its place in the manifest's list of sources, -1 at padding.
    ``flex_block_size=B`` adds the block metadata of ``flex_attention``'s causal document
    mask over the segments (a rows batch: each row of ``row_shape``; otherwise one row of
    all tokens), computed from the boundaries: ``kv_num_blocks`` (rows, 1, tiles),
    ``kv_indices`` (rows, 1, tiles, tiles), ``full_kv_num_blocks``, ``full_kv_indices`` and
    their ``q_*`` twins, int32, equal to what ``create_block_mask`` builds, and
    ``block_size``; ``sortpack.torch.block_mask(batch)`` makes the ``BlockMask``.
    """
    return VarlenCollate(key, tokenize, pad_id, position_ids_start, pad_to_multiple, labels, source_ids=source_ids,
                         flex_block_size=flex_block_size)


def hf_inputs(batch: dict, rows: bool = False) -> dict:
    """Return the keyword arguments a Hugging Face model takes for a ``varlen_collate`` batch (padding-free).

    ``input_ids``, ``labels`` and ``position_ids`` as ``(1, total)``, with ``cu_seq_lens_q/k``,
    ``max_length_q/k`` and ``seq_idx`` for flash-attention kernels; with ``rows=True`` (a
    ``--rows`` index) as ``(rows, padded_size)`` and no varlen keys (the model's SDPA, eager
    or flex path finds the documents from the restarting ``position_ids``). ``use_cache`` is
    False: with a KV cache (the config's default, also in training) or an ``attention_mask``,
    Hugging Face models stop looking for packed documents and let them attend to each other.
    """
    if rows:
        if "row_shape" not in batch:
            raise ValueError("hf_inputs(rows=True) needs a varlen_collate batch of a --rows index (its row_shape)")
        out = {k: batch[k].view(batch["row_shape"]) for k in ("input_ids", "labels", "position_ids")}
        out["use_cache"] = False
        return out
    out = {k: batch[k][None] for k in ("input_ids", "labels", "position_ids", "seq_idx")}
    out["use_cache"] = False
    for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
        out[k] = batch[k]
    return out
