"""Collate helpers: a micro-batch's dataset items into padded or varlen torch tensors (the public face).

torch is imported only when a collate function runs. The helpers learn a micro-batch's shape
(``batch_size``, ``padded_size``, ``row_splits``) and step from the ``MicroBatch`` the dataset
passes through (``SourceDataset`` and ``PackedDataset`` do), and fall back to the items' own
lengths otherwise; what they ask of the items is the ``Samples`` contract
(``samples_contract.py``). The work lives in ``collate_pad.py`` (``pad_collate``),
``collate_varlen.py`` (``varlen_collate``, ``hf_inputs``) with ``segments.py`` (its layout),
``collate_common.py`` (what both share) and ``flex_blocks.py`` (flex-attention block metadata).
"""
from __future__ import annotations

from .collate_common import IGNORE_INDEX
from .collate_pad import PadCollate, pad_collate
from .collate_varlen import VarlenCollate, hf_inputs, varlen_collate
from .flex_blocks import FlexBlocks, block_mask, document_blocks
from .microbatch import MicroBatch, Samples
from .segments import Segments

__all__ = ["IGNORE_INDEX", "FlexBlocks", "PackedDataset", "PadCollate", "Segments", "VarlenCollate", "block_mask",
           "document_blocks", "hf_inputs", "pad_collate", "varlen_collate"]


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
