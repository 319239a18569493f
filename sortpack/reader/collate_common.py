"""What the padded and the varlen collate share: the items' token ids and labels, their sample ids, torch's tensors.

Every function here reads the items through the ``Samples`` contract
(``samples_contract.SamplesContract``) and the ``MicroBatch`` they carry; torch is imported
only when a collate first needs a tensor.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..inputs.finetune.encoded import IGNORE_INDEX  # the one definition: fine-tuning labels' home
from ..kernels.tokens import NO_IDS, Fill, TokenView, ids_arg, token_view
from .flex_blocks import BLOCK_KEYS, document_blocks
from .microbatch import MicroBatch
from .samples_contract import SamplesContract, as_samples
from .tokens import check_planned, ragged_labeled, stored_token_view

LABELS_ONLY = Fill(IGNORE_INDEX, IGNORE_INDEX)  # given labels laid out as ids are: -100 wherever no token is


def round_up(n: int, k: int | None) -> int:
    """Return ``n`` rounded up to a multiple of ``k`` (``n`` itself for no ``k`` or ``k`` of 1)."""
    return -(-n // k) * k if k and k > 1 else n


def sample_ids(mb: MicroBatch | None, n: int, items: SamplesContract) -> np.ndarray:
    """Return the sample ids of the n items as a new int64 array (-1 each where nothing says)."""
    known = items.sample_ids  # the stored slice's ids (TableSamples), already an array
    if known is not None and len(known) == n:
        return np.array(known, dtype=np.int64)
    if mb is None:
        return np.full(n, -1, dtype=np.int64)
    return np.array(mb if len(mb) == n else mb[:n], dtype=np.int64).reshape(-1)


def known_ids(mb: MicroBatch | None, n: int, items: SamplesContract) -> np.ndarray | None:
    """Return the sample ids of the n items for the kernels (int32 or int64, no copy when stored), None: unknown."""
    known = items.sample_ids
    if known is not None and len(known) == n:
        return known
    if mb is None:
        return None
    ids = np.array(mb if len(mb) == n else mb[:n], dtype=np.int64).reshape(-1)
    if len(ids) != n:
        raise ValueError(f"collate: {n} items, but the micro-batch has {len(ids)} sample ids")
    return ids


def ids_arg_of(mb: MicroBatch | None, n: int, items: SamplesContract) -> tuple[int, int, int]:
    """Return the kernels' (address, width, count) of the n items' sample ids (``known_ids``; kept address reused)."""
    at = items.sample_ids_at
    if at:  # a whole stored micro-batch: its ids' address came with them
        known = items.sample_ids
        if len(known) == n:
            return at, known.itemsize, n
    ids = known_ids(mb, n, items)
    return NO_IDS if ids is None else ids_arg(ids)


def is_repeat(mb: MicroBatch | None) -> bool:
    """Return whether the items' micro-batch repeats one to fill a step (none: False)."""
    return mb is not None and bool(mb.repeat)


_TENSORS: list = []  # (torch.LongTensor, torch.BoolTensor, torch.IntTensor) once a collate has imported torch


def tensor_types() -> tuple:
    """Return torch's (LongTensor, BoolTensor, IntTensor): uninitialised CPU tensors of given sizes, cheapest to make.

    ``torch.LongTensor(rows, width)`` costs half of ``torch.empty((rows, width), dtype=torch.int64)``
    (no keyword parsing), and is a CPU tensor whatever ``torch.set_default_device`` says, which
    the kernels that write into it need.
    """
    if not _TENSORS:
        import torch

        _TENSORS[:] = (torch.LongTensor, torch.BoolTensor, torch.IntTensor)
    return tuple(_TENSORS)


def token_arrays(items: SamplesContract, key, tokenize, labels=None) -> tuple[TokenView, TokenView | None]:
    """Return the ``TokenView`` of the items' token ids and of their labels (None: none given).

    Stored ids and labels are zero-copy views; anything else goes through ``ragged_labeled``.
    """
    view = stored_token_view(items, key) if tokenize is None else None
    if view is not None:
        if not (isinstance(labels, str) and items.has_column(labels)):
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


def mask_labels(labels: np.ndarray, laid: np.ndarray) -> None:
    """Write the given labels ``laid`` out as the ids are into ``labels`` where it has a target (in place).

    ``labels`` already holds -100 at padding and at each document's first position; the given
    labels add their own -100 (a prompt, a user turn) everywhere else.
    """
    np.copyto(labels, laid, where=labels != IGNORE_INDEX)


def check_block_size(size) -> None:
    """Raise ValueError unless ``size`` (a collate's ``flex_block_size``) is None or a positive integer."""
    if size is not None and not (isinstance(size, (int, np.integer)) and not isinstance(size, bool) and size >= 1):
        raise ValueError(f"flex_block_size must be a positive integer (a flex_attention BLOCK_SIZE), not {size!r}")


def source_of(mb: MicroBatch | None) -> int:
    """Return the source id of a mixture plan's micro-batch (its place in the manifest's sources).

    Raises ValueError for items without a micro-batch or a micro-batch of a plan that is no
    mixture: ``source_ids=True`` has nothing to say there.
    """
    if mb is None or mb.source_id < 0:
        what = "items without their MicroBatch" if mb is None else f"micro-batch {mb.microbatch} of no mixture plan"
        raise ValueError(f"collate: source_ids=True needs the micro-batches of a mixture plan (sortpack run --mixture "
                         f"or --blend), read through SourceDataset or PackedDataset; got {what}")
    return int(mb.source_id)


def source_tokens(mb: MicroBatch | None, real) -> np.ndarray:
    """Return the per-token source ids of ``mb`` over a mask of real tokens: its source id, -1 at padding (int64)."""
    return np.where(np.asarray(real, dtype=bool), np.int64(source_of(mb)), np.int64(-1))


class CollateBase:
    """What ``PadCollate`` and ``VarlenCollate`` share: their items' token arrays, and the extras asked for.

    ``key``, ``tokenize`` and ``labels`` say where the ids and labels come from;
    ``source_ids`` and ``flex_block_size`` ask for per-token source ids and flex block metadata.
    """

    key: object = None
    tokenize: Callable | None = None
    labels: str | None = "labels"
    source_ids: bool = False
    flex_block_size: int | None = None

    def _asked(self, source_ids: bool, flex_block_size: int | None) -> None:
        """Keep the extras asked for (ValueError for a block size that is no positive integer)."""
        check_block_size(flex_block_size)
        self.source_ids, self.flex_block_size = bool(source_ids), flex_block_size

    def _read(self, items) -> tuple[SamplesContract, TokenView, TokenView | None]:
        """Return the items as the ``Samples`` contract and the ``TokenView`` of their ids and labels (or None)."""
        items = as_samples(items)
        view, given = token_arrays(items, self.key, self.tokenize, self.labels)
        return items, view, given

    def _extras(self, out: dict, mb: MicroBatch | None, real: np.ndarray,
                bounds: Callable[[], tuple[np.ndarray, int, int]]) -> None:
        """Add the source ids (over the ``real`` token mask) and the block metadata of ``bounds()`` when asked for.

        ``bounds`` returns (document boundaries, rows, row length) of the batch's layout.
        """
        import torch

        if self.source_ids:
            out["source_ids"] = torch.from_numpy(source_tokens(mb, real))
        if self.flex_block_size is not None:
            cu, rows, width = bounds()
            out.update(zip(BLOCK_KEYS, map(torch.from_numpy, document_blocks(cu, rows, width, self.flex_block_size))))
            out["block_size"] = int(self.flex_block_size)

