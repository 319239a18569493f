"""Collate helpers: a micro-batch's dataset items into padded or varlen torch tensors.

torch is imported only when a collate function runs. The helpers learn a micro-batch's shape
(``batch_size``, ``padded_size``, ``row_splits``) and step from the ``MicroBatch`` the dataset
passes through (``SourceDataset`` and ``PackedDataset`` do), and fall back to the items' own
lengths otherwise.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..inputs.finetune.encoded import IGNORE_INDEX  # the one definition: fine-tuning labels' home
from ..kernels import pad_tokens, varlen_tokens
from ..kernels.tokens import NO_IDS, BatchKernels, Fill, RowMarks, TokenView, batch_kernels, ids_arg, token_view
from .microbatch import MicroBatch, Samples
from .tokens import check_planned, ragged_labeled, stored_token_view


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
_LABELS_ONLY = Fill(IGNORE_INDEX, IGNORE_INDEX)  # given labels laid out as ids are: -100 wherever no token is


def _round_up(n: int, k: int | None) -> int:
    return -(-n // k) * k if k and k > 1 else n


def _sample_ids(mb, n: int, items=None) -> np.ndarray:
    known = getattr(items, "sample_ids", None)  # the stored slice's ids (TableSamples), already an array
    if known is not None and len(known) == n:
        return np.array(known, dtype=np.int64)
    if mb is None:
        return np.full(n, -1, dtype=np.int64)
    return np.array(mb if len(mb) == n else mb[:n], dtype=np.int64).reshape(-1)


def _known_ids(mb, n: int, items=None) -> np.ndarray | None:
    """Return the sample ids of the n items for the kernels (int32 or int64, no copy when stored), None: unknown."""
    known = getattr(items, "sample_ids", None)
    if known is not None and len(known) == n:
        return known
    if mb is None:
        return None
    ids = np.array(mb if len(mb) == n else mb[:n], dtype=np.int64).reshape(-1)
    if len(ids) != n:
        raise ValueError(f"collate: {n} items, but the micro-batch has {len(ids)} sample ids")
    return ids


def _ids_of(mb, n: int, items) -> tuple[int, int, int]:
    """Return the kernels' (address, width, count) of the n items' sample ids (``_known_ids``; kept address reused)."""
    at = getattr(items, "sample_ids_at", 0)
    if at:  # a whole stored micro-batch: its ids' address came with them
        known = items.sample_ids
        if len(known) == n:
            return at, known.itemsize, n
    ids = _known_ids(mb, n, items)
    return NO_IDS if ids is None else ids_arg(ids)


_TENSORS: list = []  # (torch.LongTensor, torch.BoolTensor, torch.IntTensor) once a collate has imported torch


def _tensor_types() -> tuple:
    """Return torch's (LongTensor, BoolTensor, IntTensor): uninitialised CPU tensors of given sizes, cheapest to make.

    ``torch.LongTensor(rows, width)`` costs half of ``torch.empty((rows, width), dtype=torch.int64)``
    (no keyword parsing), and is a CPU tensor whatever ``torch.set_default_device`` says, which
    the kernels that write into it need.
    """
    if not _TENSORS:
        import torch

        _TENSORS[:] = (torch.LongTensor, torch.BoolTensor, torch.IntTensor)
    return tuple(_TENSORS)


def _has_column(items, key) -> bool:
    has = getattr(items, "has_column", None)
    if has is not None:
        return bool(has(key))
    table = getattr(items, "table", None)
    return table is not None and key in table.schema.names


def _token_arrays(items, key, tokenize, labels=None) -> tuple[TokenView, TokenView | None]:
    """Return the ``TokenView`` of the items' token ids and of their labels (None: none given).

    Stored ids and labels are zero-copy views; anything else goes through ``ragged_labeled``.
    """
    view = stored_token_view(items, key) if tokenize is None else None
    if view is not None:
        if not (isinstance(labels, str) and _has_column(items, labels)):
            return view, None
        lab = stored_token_view(items, labels)
        if lab is not None:
            if not np.array_equal(np.diff(lab.offsets), np.diff(view.offsets)):
                raise ValueError(f"collate: the stored {labels!r} and {key!r} differ in length")
            return view, lab
    values, offsets, lab_values = ragged_labeled(items, key, tokenize, labels)
    view = token_view(values, offsets)
    if tokenize is not None:
        check_planned(items, view)  # a tokenizer that truncates or pads gives other lengths than the plan's
    return view, None if lab_values is None else token_view(lab_values, offsets)


def _mask_labels(labels: np.ndarray, laid: np.ndarray) -> None:
    """Write the given labels ``laid`` out as the ids are into ``labels`` where it has a target (in place).

    ``labels`` already holds -100 at padding and at each document's first position; the given
    labels add their own -100 (a prompt, a user turn) everywhere else.
    """
    np.copyto(labels, laid, where=labels != IGNORE_INDEX)


def _refuse_rows(mb) -> None:
    """Raise ValueError (one line) for a micro-batch of a ``--rows`` plan: pad_collate would pad each of its documents
    to the row length, not lay its rows out (a likely out-of-memory on a device, silently)."""
    splits = getattr(mb, "row_splits", None)
    if splits is not None and getattr(mb, "padded_size", None) is not None:
        raise ValueError(f"pad_collate: micro-batch {getattr(mb, 'microbatch', '?')} is {len(splits) - 1} packed rows "
                         f"of {mb.padded_size} positions (a --rows plan), which pad_collate would pad document by "
                         "document; use varlen_collate (its rows: hf_inputs(batch, rows=True))")


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
    labels : str, optional
        The stored column (or item key) of the labels aligned to the ids (-100: no target).
    """

    def __init__(self, pad_id: int = 0, key=None, tokenize=None, attn_mask: str | None = None,
                 pad_to_multiple: int | None = None, labels: str | None = "labels"):
        if attn_mask not in (None, "causal", "full"):
            raise ValueError(f"attn_mask must be None, 'causal' or 'full', not {attn_mask!r}")
        self.pad_id, self.key, self.tokenize = pad_id, key, tokenize
        self.attn_mask, self.pad_to_multiple = attn_mask, pad_to_multiple
        self.labels = labels

    def __call__(self, items) -> dict:
        """Return input_ids, labels, lengths, key_padding_mask, real, sample_ids (and attn_mask) tensors."""
        mb = getattr(items, "microbatch", None)
        _refuse_rows(mb)
        view, given = _token_arrays(items, self.key, self.tokenize, self.labels)
        n = len(view.offsets) - 1
        if mb is not None and mb.padded_size is not None:
            rows, width = int(mb.batch_size), int(mb.padded_size)
            if rows < n:
                rows = n
        else:
            longest = int(np.diff(view.offsets).max(initial=0))
            rows, width = n, _round_up(longest, self.pad_to_multiple)
        # one pass (compiled): a tokenizer longer than the index's size is cut to the shape;
        # labels aligned to input_ids (the model shifts): no target at a sample's first token or at padding
        kernels = batch_kernels()
        if kernels is not None:
            out, padding = self._compiled(kernels, view, (rows, width), mb, items)
        else:
            out, padding = self._numpy(view, (rows, width), items)
        if given is not None:
            _mask_labels(out["labels"].numpy(), pad_tokens(given.values, given.offsets, n, (rows, width),
                                                           _LABELS_ONLY)[0])
        if mb is not None:
            out["microbatch"] = mb.info()
        if self.attn_mask is not None:
            assert padding is not None  # the compiled path hands it over when there is a mask to build
            valid = ~padding
            allowed = valid[:, None, :] & valid[:, :, None]
            if self.attn_mask == "causal":
                allowed &= np.tril(np.ones((width, width), dtype=bool))[None]
            # padding queries attend to themselves only, so no softmax row is empty (no NaN)
            allowed |= np.eye(width, dtype=bool)[None] & ~valid[:, :, None]
            import torch

            out["attn_mask"] = torch.from_numpy(allowed)
        return out

    def _compiled(self, kernels: BatchKernels, view: TokenView, shape: tuple[int, int], mb,
                  items) -> tuple[dict, np.ndarray | None]:
        """Return the batch of ``shape`` written by the compiled kernel into tensors torch allocated, and its mask.

        torch's own tensors, not numpy arrays: freeing a tensor made by ``torch.from_numpy``
        lets go of the GIL, and beside ``PlanLoader``'s thread that costs a thread switch.
        """
        rows, width = shape
        long, flag, _ = _TENSORS or _tensor_types()
        ids, labels, lengths = long(rows, width), long(rows, width), long(rows)
        padding, sample_ids, real = flag(rows, width), long(rows), flag(rows)
        kernels.pad_batch(view, shape, (int(self.pad_id), IGNORE_INDEX), _ids_of(mb, len(view.offsets) - 1, items),
                          not getattr(mb, "repeat", False),
                          (ids.data_ptr(), labels.data_ptr(), lengths.data_ptr(), padding.data_ptr(),
                           sample_ids.data_ptr(), real.data_ptr()))
        out = {"input_ids": ids, "labels": labels, "lengths": lengths, "key_padding_mask": padding, "real": real,
               "sample_ids": sample_ids}
        return out, (padding.numpy() if self.attn_mask is not None else None)

    def _numpy(self, view: TokenView, shape: tuple[int, int], items) -> tuple[dict, np.ndarray]:
        """Return the batch from ``pad_tokens``' arrays (the numpy fallback of the kernels), and its padding mask."""
        import torch

        mb, n, rows = getattr(items, "microbatch", None), len(view.offsets) - 1, shape[0]
        ids, labels, lengths, padding = pad_tokens(view.values, view.offsets, n, shape, Fill(self.pad_id, IGNORE_INDEX))
        sample_ids = np.full(rows, -1, dtype=np.int64)
        sample_ids[:n] = _sample_ids(mb, n, items)
        real = np.zeros(rows, dtype=np.bool_)
        real[:n] = not getattr(mb, "repeat", False)
        out = {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "lengths": torch.from_numpy(lengths),
            "key_padding_mask": torch.from_numpy(padding),
            "real": torch.from_numpy(real),
            "sample_ids": torch.from_numpy(sample_ids),
        }
        return out, padding


def pad_collate(pad_id: int = 0, key=None, tokenize=None, attn_mask: str | None = None,
                pad_to_multiple: int | None = None, labels: str | None = "labels") -> PadCollate:
    """Return a picklable collate_fn that pads a micro-batch to its ``(batch_size, padded_size)``.

    Items are token-id sequences, ``item[key]``, or ``tokenize(item)``; a stored list (or
    binary) column named by ``key`` is read straight from the Arrow buffers. The result holds
    ``input_ids`` (B, T), ``labels`` (B, T; ``input_ids`` with -100 at each sample's first
    position and at padding, aligned to the inputs: a causal LM shifts them, as Hugging Face
    models do), ``lengths`` (B,), ``key_padding_mask`` (B, T; True = padding, as
    ``nn.MultiheadAttention``), ``real`` (B,; False for the index's padding slots, which are
    fully masked, and for every row of a micro-batch repeated to fill a step: skip those when
    evaluating), ``sample_ids`` (B,; -1 where unknown), ``microbatch`` (the ``MicroBatch.info()``
    dict: epoch, step, position, end, last, step_batch, step_tokens, world_size,
    tokens, repeat; pass the batch to ``sampler.consume`` and ``step_loss``) and, with
    ``attn_mask="causal"`` or ``"full"``, ``attn_mask`` (B, T, T; True = may attend, as
    ``F.scaled_dot_product_attention``).
    Without a known shape, T is the longest item rounded up to ``pad_to_multiple``.

    Fine-tuning data brings its own labels (-100: no target, e.g. a prompt): a stored list
    column named ``labels`` beside ``key`` (``--store-tokens`` of a fine-tuning shape, or
    ``--store input_ids,labels``), ``item[labels]`` beside ``item[key]``, or ``tokenize(item)``
    returning ``(ids, labels)`` (``sortpack.inputs.finetune.FineTuneShape`` does). ``labels``
    then holds them, still -100 at padding and at each sample's first position.

    Examples
    --------
    Micro-batch 1 of ``plan/`` (``PackedIndex``'s example), its texts' bytes as token ids,
    padded to the plan's shape (3 samples, 8 positions):

    >>> from sortpack.reader import PackedSampler, SourceDataset
    >>> from sortpack.torch import pad_collate
    >>> collate = pad_collate(tokenize=lambda row: list(row["text"].encode()))
    >>> mb = next(iter(PackedSampler("plan/", rank=1, world_size=2)))
    >>> batch = collate(SourceDataset("plan/").__getitems__(mb))
    >>> tuple(batch["input_ids"].shape), batch["lengths"].tolist(), batch["sample_ids"].tolist()
    ((3, 8), [6, 7, 8], [3, 10, 1])
    >>> batch["input_ids"][0].tolist()  # sample 3, "abcdef", then pad_id
    [97, 98, 99, 100, 101, 102, 0, 0]
    >>> batch["labels"][0].tolist()  # no target at the first position and at padding
    [-100, 98, 99, 100, 101, 102, -100, -100]
    """
    return PadCollate(pad_id, key, tokenize, attn_mask, pad_to_multiple, labels)


class Segments(NamedTuple):
    """How ``varlen_collate`` lays a micro-batch out: one entry per segment (a document or a row's padding)."""

    length: np.ndarray  # tokens of each segment, padding included
    real: np.ndarray  # real tokens of each segment
    sample: np.ndarray  # the sample of each segment (its place in the micro-batch), -1 for a row's padding
    width: int | None  # rows mode: the padded row length; None otherwise


def _segments(lengths: np.ndarray, mb, pad_to_multiple: int | None) -> Segments:
    """Return the ``Segments`` of a micro-batch whose samples have ``lengths`` tokens.

    Rows mode (the micro-batch's ``row_splits`` and ``padded_size``): each row's samples (each
    padded to a multiple of ``pad_to_multiple`` when given), cut to the row's room, then the
    row's padding tail as its own segment. Otherwise one segment per sample, padded to a
    multiple of ``pad_to_multiple`` when given.
    """
    n = len(lengths)
    splits = getattr(mb, "row_splits", None)
    k = pad_to_multiple if pad_to_multiple and pad_to_multiple > 1 else 1
    if splits is not None and mb.padded_size is not None:
        width = int(mb.padded_size)
        splits = np.asarray(splits, dtype=np.int64)
        rows = len(splits) - 1
        row_of = np.repeat(np.arange(rows), np.diff(splits))
        padded = -(-lengths // k) * k  # a plan packed with --pad-to-multiple K counted them so: they fit
        cum = np.concatenate(([0], np.cumsum(padded)))
        before = cum[:-1] - cum[splits[:-1]][row_of]  # tokens before each sample in its row
        kept = np.clip(width - before, 0, padded)  # a row longer than its packed length is cut
        room = width - np.bincount(row_of, weights=kept, minlength=rows).astype(np.int64)
        pads = room > 0
        pads_before: np.ndarray = np.cumsum(pads) - pads
        seg_len = np.zeros(n + int(pads.sum()), dtype=np.int64)
        seg_sample = np.full(len(seg_len), -1, dtype=np.int64)
        at = np.arange(n) + pads_before[row_of]
        seg_len[at], seg_sample[at] = kept, np.arange(n)
        seg_len[(splits[1:] + pads_before)[pads]] = room[pads]
        seg_real = np.zeros(len(seg_len), dtype=np.int64)
        seg_real[at] = np.minimum(kept, lengths)  # a document's own tokens, without its padding to K
        return Segments(seg_len, seg_real, seg_sample, width)
    if mb is not None and mb.padded_size is not None:
        lengths = np.minimum(lengths, int(mb.padded_size))  # as pad_collate: never longer than the plan's shape
    seg_len = -(-lengths // pad_to_multiple) * pad_to_multiple if pad_to_multiple and pad_to_multiple > 1 else lengths
    return Segments(seg_len, lengths, np.arange(n, dtype=np.int64), None)


class VarlenCollate:
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
    """

    def __init__(self, key=None, tokenize=None, pad_id: int = 0, position_ids_start: int = 0,
                 pad_to_multiple: int | None = None, labels: str | None = "labels"):
        if pad_to_multiple is not None and int(pad_to_multiple) < 1:
            raise ValueError(f"pad_to_multiple must be a positive integer, not {pad_to_multiple!r}")
        self.key, self.tokenize, self.pad_id = key, tokenize, pad_id
        self.position_ids_start = int(position_ids_start)
        self.pad_to_multiple = int(pad_to_multiple) if pad_to_multiple else None
        self.labels = labels

    def __call__(self, items) -> dict:
        """Return input_ids, labels, position_ids, cu_seqlens, seq_idx, the Hugging Face keys, lengths and masks."""
        import torch

        view, given = _token_arrays(items, self.key, self.tokenize, self.labels)
        mb = getattr(items, "microbatch", None)
        kernels = batch_kernels()
        rows = getattr(mb, "row_splits", None) is not None and getattr(mb, "padded_size", None) is not None
        if kernels is not None and not rows and not (self.pad_to_multiple and self.pad_to_multiple > 1):
            out = self._compiled(kernels, view, mb, items)  # one segment per sample: the usual layout
            if given is not None:
                kept = out["lengths"].numpy()
                cu = np.concatenate(([0], np.cumsum(kept)))
                _mask_labels(out["labels"].numpy(), varlen_tokens(
                    given.values, given.offsets, (cu, kept, np.arange(len(kept), dtype=np.int64)), _LABELS_ONLY)[0])
            if mb is not None:
                out["microbatch"] = mb.info()
            return out
        values, offsets = view.values, view.offsets
        full = np.diff(offsets).astype(np.int64, copy=False)
        n = len(full)
        seg_len, seg_real, seg_sample, width = _segments(full, mb, self.pad_to_multiple)
        cu = np.zeros(len(seg_len) + 1, dtype=np.int64)
        np.cumsum(seg_len, out=cu[1:])
        total = int(cu[-1])
        if width is None:  # one segment per sample, in order
            kept = seg_real
        else:
            doc = seg_sample >= 0
            kept = np.zeros(n, dtype=np.int64)
            kept[seg_sample[doc]] = seg_real[doc]
        # one pass (compiled) writes every per-token array
        ids, labels, position_ids, seg_of, token_mask = varlen_tokens(
            values, offsets, (cu, seg_real, seg_sample), Fill(self.pad_id, IGNORE_INDEX, self.position_ids_start))
        if given is not None:
            _mask_labels(labels, varlen_tokens(given.values, given.offsets, (cu, seg_real, seg_sample),
                                               _LABELS_ONLY)[0])
        cu32 = torch.from_numpy(cu.astype(np.int32))
        max_len = int(seg_len.max(initial=0))
        out = {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(position_ids),
            "cu_seqlens": cu32,
            "max_seqlen": max_len,
            "seq_index": torch.from_numpy(seg_sample),
            "seq_idx": torch.from_numpy(seg_of),
            "cu_seq_lens_q": cu32,
            "cu_seq_lens_k": cu32,
            "max_length_q": max_len,
            "max_length_k": max_len,
            "lengths": torch.from_numpy(kept),
            "token_mask": torch.from_numpy(token_mask),
            "sample_ids": torch.from_numpy(_sample_ids(mb, n, items)),
            "real": torch.from_numpy(np.full(n, not getattr(mb, "repeat", False))),
        }
        if self.pad_to_multiple:
            # Transformer Engine's THD layout: cu_seqlens counts real tokens, cu_seqlens_padded bounds the tensor
            real_cu = np.zeros(len(seg_len) + 1, dtype=np.int32)
            np.cumsum(seg_real, out=real_cu[1:])
            out["cu_seqlens"], out["cu_seqlens_padded"] = torch.from_numpy(real_cu), cu32
            out["max_seqlen"] = int(seg_real.max(initial=0))
        if width is not None:
            out["row_shape"] = (total // width, width)
        if mb is not None:
            out["microbatch"] = mb.info()
        return out


    def _compiled(self, kernels, view, mb, items) -> dict:
        """Return the batch of one segment per sample, written by one compiled call into tensors torch allocated.

        The same batch as ``_segments``' layout without rows or ``pad_to_multiple`` (each sample
        cut to the micro-batch's ``padded_size``), with as few torch calls as the outputs allow.
        """
        n = len(view.offsets) - 1
        room = int(view.offsets[n]) - int(view.offsets[0]) if n > 0 else 0  # tokens before any cut
        long, flag, int32 = _TENSORS or _tensor_types()
        ids, labels, positions, seq_idx = long(room), long(room), long(room), int32(room)
        mask, cu, lengths, seq_index = flag(room), int32(n + 1), long(n), long(n)
        sample_ids, real = long(n), flag(n)
        cap = None if mb is None or mb.padded_size is None else int(mb.padded_size)
        total, longest = kernels.varlen_into(
            view, cap, Fill(self.pad_id, IGNORE_INDEX, self.position_ids_start),
            RowMarks(_known_ids(mb, n, items), not getattr(mb, "repeat", False)),
            (ids.data_ptr(), labels.data_ptr(), positions.data_ptr(), seq_idx.data_ptr(), mask.data_ptr(),
             cu.data_ptr(), lengths.data_ptr(), seq_index.data_ptr(), sample_ids.data_ptr(), real.data_ptr()))
        if total < room:  # a sample longer than the plan's shape was cut
            ids, labels, positions, seq_idx, mask = (t[:total] for t in (ids, labels, positions, seq_idx, mask))
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "cu_seqlens": cu, "max_seqlen": longest,
                "seq_index": seq_index, "seq_idx": seq_idx, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
                "max_length_q": longest, "max_length_k": longest, "lengths": lengths, "token_mask": mask,
                "sample_ids": sample_ids, "real": real}


def varlen_collate(key=None, tokenize=None, pad_id: int = 0, position_ids_start: int = 0,
                   pad_to_multiple: int | None = None, labels: str | None = "labels") -> VarlenCollate:
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
    """
    return VarlenCollate(key, tokenize, pad_id, position_ids_start, pad_to_multiple, labels)


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
