"""``pad_collate``: a micro-batch's items padded into one ``(batch_size, padded_size)`` batch of torch tensors."""
from __future__ import annotations

import numpy as np

from ..kernels import pad_tokens
from ..kernels.tokens import BatchKernels, Fill, TokenView, batch_kernels
from .collate_common import (
    _TENSORS,
    IGNORE_INDEX,
    LABELS_ONLY,
    CollateBase,
    ids_arg_of,
    is_repeat,
    mask_labels,
    round_up,
    sample_ids,
    tensor_types,
)
from .flex_blocks import row_cu
from .microbatch import MicroBatch
from .samples_contract import SamplesContract


def _refuse_rows(mb) -> None:
    """Raise ValueError (one line) for a micro-batch of a ``--rows`` plan: pad_collate would pad each of its documents
    to the row length, not lay its rows out (a likely out-of-memory on a device, silently)."""
    splits = getattr(mb, "row_splits", None)
    if splits is not None and getattr(mb, "padded_size", None) is not None:
        raise ValueError(f"pad_collate: micro-batch {getattr(mb, 'microbatch', '?')} is {len(splits) - 1} packed rows "
                         f"of {mb.padded_size} positions (a --rows plan), which pad_collate would pad document by "
                         "document; use varlen_collate (its rows: hf_inputs(batch, rows=True))")


class PadCollate(CollateBase):
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
    source_ids : bool
        Also return each token's source id (a mixture plan's; -1 at padding).
    flex_block_size : int, optional
        Also return the block metadata of the rows' causal document mask, in tiles of this size.
    """

    def __init__(self, pad_id: int = 0, key=None, tokenize=None, attn_mask: str | None = None,
                 pad_to_multiple: int | None = None, labels: str | None = "labels", *, source_ids: bool = False,
                 flex_block_size: int | None = None):
        if attn_mask not in (None, "causal", "full"):
            raise ValueError(f"attn_mask must be None, 'causal' or 'full', not {attn_mask!r}")
        self._asked(source_ids, flex_block_size)
        self.pad_id, self.key, self.tokenize = pad_id, key, tokenize
        self.attn_mask, self.pad_to_multiple = attn_mask, pad_to_multiple
        self.labels = labels

    def __call__(self, items) -> dict:
        """Return input_ids, labels, lengths, key_padding_mask, real, sample_ids (and attn_mask) tensors."""
        items, view, given = self._read(items)
        mb = items.microbatch
        _refuse_rows(mb)
        shape = self._shape(view, mb)
        # one pass (compiled): a tokenizer longer than the index's size is cut to the shape;
        # labels aligned to input_ids (the model shifts): no target at a sample's first token or at padding
        kernels = batch_kernels()
        if kernels is not None:
            out, padding = self._compiled(kernels, view, shape, items)
        else:
            out, padding = self._numpy(view, shape, items)
        if given is not None:
            mask_labels(out["labels"].numpy(), pad_tokens(given.values, given.offsets, len(view.offsets) - 1, shape,
                                                          LABELS_ONLY)[0])
        if mb is not None:
            out["microbatch"] = mb.info()
        if self.attn_mask is not None:
            assert padding is not None  # the compiled path hands it over when there is a mask to build
            out["attn_mask"] = self._dense_mask(padding)
        rows, width = shape
        self._extras(out, mb, ~out["key_padding_mask"].numpy(),
                     lambda: (row_cu(out["lengths"].numpy(), width), rows, width))
        return out

    def _shape(self, view: TokenView, mb: MicroBatch | None) -> tuple[int, int]:
        """Return the batch's (rows, width): the micro-batch's shape, else the longest item rounded up."""
        n = len(view.offsets) - 1
        if mb is not None and mb.padded_size is not None:
            return max(int(mb.batch_size), n), int(mb.padded_size)
        longest = int(np.diff(view.offsets).max(initial=0))
        return n, round_up(longest, self.pad_to_multiple)

    def _dense_mask(self, padding: np.ndarray):
        """Return the (B, T, T) boolean attention mask of ``attn_mask`` (True = may attend)."""
        import torch

        width = padding.shape[1]
        valid = ~padding
        allowed = valid[:, None, :] & valid[:, :, None]
        if self.attn_mask == "causal":
            allowed &= np.tril(np.ones((width, width), dtype=bool))[None]
        # padding queries attend to themselves only, so no softmax row is empty (no NaN)
        allowed |= np.eye(width, dtype=bool)[None] & ~valid[:, :, None]
        return torch.from_numpy(allowed)

    def _compiled(self, kernels: BatchKernels, view: TokenView, shape: tuple[int, int],
                  items: SamplesContract) -> tuple[dict, np.ndarray | None]:
        """Return the batch of ``shape`` written by the compiled kernel into tensors torch allocated, and its mask.

        torch's own tensors, not numpy arrays: freeing a tensor made by ``torch.from_numpy``
        lets go of the GIL, and beside ``PlanLoader``'s thread that costs a thread switch.
        """
        rows, width = shape
        mb = items.microbatch
        long, flag, _ = _TENSORS or tensor_types()
        ids, labels, lengths = long(rows, width), long(rows, width), long(rows)
        padding, sample_id, real = flag(rows, width), long(rows), flag(rows)
        kernels.pad_batch(view, shape, (int(self.pad_id), IGNORE_INDEX), ids_arg_of(mb, len(view.offsets) - 1, items),
                          not is_repeat(mb),
                          (ids.data_ptr(), labels.data_ptr(), lengths.data_ptr(), padding.data_ptr(),
                           sample_id.data_ptr(), real.data_ptr()))
        out = {"input_ids": ids, "labels": labels, "lengths": lengths, "key_padding_mask": padding, "real": real,
               "sample_ids": sample_id}
        return out, (padding.numpy() if self.attn_mask is not None else None)

    def _numpy(self, view: TokenView, shape: tuple[int, int], items: SamplesContract) -> tuple[dict, np.ndarray]:
        """Return the batch from ``pad_tokens``' arrays (the numpy fallback of the kernels), and its padding mask."""
        import torch

        mb, n, rows = items.microbatch, len(view.offsets) - 1, shape[0]
        ids, labels, lengths, padding = pad_tokens(view.values, view.offsets, n, shape, Fill(self.pad_id, IGNORE_INDEX))
        sample_id = np.full(rows, -1, dtype=np.int64)
        sample_id[:n] = sample_ids(mb, n, items)
        real = np.zeros(rows, dtype=np.bool_)
        real[:n] = not is_repeat(mb)
        out = {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "lengths": torch.from_numpy(lengths),
            "key_padding_mask": torch.from_numpy(padding),
            "real": torch.from_numpy(real),
            "sample_ids": torch.from_numpy(sample_id),
        }
        return out, padding


def pad_collate(pad_id: int = 0, key=None, tokenize=None, attn_mask: str | None = None,
                pad_to_multiple: int | None = None, labels: str | None = "labels", *, source_ids: bool = False,
                flex_block_size: int | None = None) -> PadCollate:
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

    ``source_ids=True`` (a mixture plan) adds ``source_ids`` (B, T; int64): the micro-batch's
    source, its place in the manifest's list of sources, at every token, -1 at padding.
    ``flex_block_size=B`` adds the block metadata of a causal document mask in which each
    row's sample is one document and its padding another (``kv_num_blocks``, ``kv_indices``,
    ``full_kv_num_blocks``, ``full_kv_indices`` and their ``q_*`` twins, int32, as
    ``create_block_mask`` builds them; ``block_size``); ``sortpack.torch.block_mask(batch)``
    makes the ``BlockMask``.

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
    return PadCollate(pad_id, key, tokenize, attn_mask, pad_to_multiple, labels, source_ids=source_ids,
                      flex_block_size=flex_block_size)
