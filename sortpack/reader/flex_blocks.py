"""The block metadata of a causal document mask for ``flex_attention``, from the plan's boundaries, in numpy.

``torch.nn.attention.flex_attention.create_block_mask`` evaluates the mask function at every
(query, key) pair of every row, then sums each ``B x B`` tile: ``rows * L^2`` evaluations (a
32k-token row is a billion), at every step. A packed row's documents are contiguous, so
which tiles a causal document mask touches follows from where the documents start: a query
tile ``i`` reaches back to the tile holding the start of the document at its first query,
and the key tiles it sees whole are those from the start of the document at its last query
up to the tile before the diagonal. ``document_blocks`` computes that for every tile at once
(``rows * (L / B)^2`` booleans, no per-block Python loop) and orders the indices exactly as
``create_block_mask`` does: the tiles listed first in ascending order, then every other tile
in ascending order (its stable ``argsort``), int32, shaped ``(rows, 1, tiles[, tiles])``.

``block_mask`` hands the same metadata to ``BlockMask.from_kv_blocks`` with the document
mask's ``mask_mod`` (needs torch).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class FlexBlocks(NamedTuple):
    """A causal document mask's tiles as ``create_block_mask`` lays them out (numpy int32, one head).

    ``kv_num_blocks`` (rows, 1, tiles) counts each query tile's partly masked key tiles and
    ``kv_indices`` (rows, 1, tiles, tiles) lists them first; ``full_kv_*`` are the tiles that
    are not masked at all; ``q_*`` and ``full_q_*`` are the same seen from each key tile (what
    the backward pass reads).
    """

    kv_num_blocks: np.ndarray
    kv_indices: np.ndarray
    full_kv_num_blocks: np.ndarray
    full_kv_indices: np.ndarray
    q_num_blocks: np.ndarray
    q_indices: np.ndarray
    full_q_num_blocks: np.ndarray
    full_q_indices: np.ndarray


BLOCK_KEYS = FlexBlocks._fields  # the collates' batch keys of the metadata, in this order


def _ordered(listed: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (count, indices) of boolean tiles along ``axis``: the listed ones first, each group ascending (int32)."""
    tiles = np.moveaxis(listed, axis, -1)
    count = tiles.sum(axis=-1, dtype=np.int32)
    # a stable sort of "not listed" keeps each group in ascending order: torch's stable descending argsort
    order = np.argsort(~tiles, axis=-1, kind="stable").astype(np.int32)
    return count[:, None], order[:, None]


def document_blocks(cu: np.ndarray, rows: int, width: int, block: int) -> FlexBlocks:
    """Return the ``FlexBlocks`` of a causal document mask over ``rows`` rows of ``width`` tokens, tiles of ``block``.

    Parameters
    ----------
    cu : numpy.ndarray
        Where each document (segment) starts in the rows laid end to end, and the end
        (``rows * width``): every row start must be one of them (a document never spans rows).
    rows, width : int
        The rows and their length L (query and key length alike).
    block : int
        The tile size B of both queries and keys (``create_block_mask``'s ``BLOCK_SIZE``).
    """
    if not (isinstance(block, (int, np.integer)) and block >= 1):
        raise ValueError(f"the flex block size must be a positive integer, not {block!r}")
    block = int(block)
    cu = np.asarray(cu, dtype=np.int64)
    tiles = -(-width // block)
    tile = np.arange(tiles, dtype=np.int64)
    base = np.arange(rows, dtype=np.int64)[:, None] * width

    def doc_start(pos: np.ndarray) -> np.ndarray:
        """Return where the document holding each row's position ``pos`` starts, within its row (rows, tiles)."""
        at = base + pos[None, :]
        return cu[np.searchsorted(cu, at, side="right") - 1] - base

    first_q, last_q = tile * block, np.minimum(tile * block + block, width) - 1
    reach = doc_start(first_q) // block  # the first key tile any query of the tile may see
    whole_from = -(-doc_start(last_q) // block)  # key tiles from here are in the last query's document whole
    # whole key tiles end before the diagonal (B > 1: the diagonal tile masks its upper triangle), and a
    # tile past the row's end is padded with masked positions, so it is never whole
    whole_to = np.where(tile * block + block <= width, tile - (block > 1), -1)[None, :]
    key = tile[None, None, :]
    full = (key >= whole_from[..., None]) & (key <= whole_to[..., None])
    partial = (key >= reach[..., None]) & (key <= tile[None, :, None]) & ~full
    kv_num, kv_idx = _ordered(partial, 2)
    full_num, full_idx = _ordered(full, 2)
    q_num, q_idx = _ordered(partial, 1)
    full_q_num, full_q_idx = _ordered(full, 1)
    return FlexBlocks(kv_num, kv_idx, full_num, full_idx, q_num, q_idx, full_q_num, full_q_idx)


def row_cu(lengths: np.ndarray, width: int) -> np.ndarray:
    """Return the segment boundaries of padded rows: each row's sample (``lengths``) then its padding, end to end."""
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), width)
    starts = np.arange(len(lengths), dtype=np.int64) * width
    cuts = np.concatenate((starts, starts + lengths, [len(lengths) * width]))
    return np.unique(cuts)


def block_mask(batch: dict, device=None):
    """Return the ``torch`` ``BlockMask`` of a collate batch made with ``flex_block_size=B``, on ``device``.

    Built from the batch's block metadata with ``BlockMask.from_kv_blocks`` (its backward
    metadata too, as ``create_block_mask`` gives it, without a transposition on the device);
    its ``mask_mod`` lets a query see the keys of its own document up to itself: documents
    from ``seq_idx`` (``varlen_collate``; a rows batch by ``row_shape``) or from
    ``lengths`` (``pad_collate``: each row's sample, then its padding as a document of its
    own, so no softmax row is empty).
    """
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    if "kv_num_blocks" not in batch:
        raise ValueError("block_mask: the batch has no block metadata: collate with flex_block_size=B")
    size = int(batch["block_size"])
    got = {k: batch[k].to(device) for k in BLOCK_KEYS}
    doc = _documents(batch).to(device)
    width = int(doc.shape[1])

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)

    mask = BlockMask.from_kv_blocks(got["kv_num_blocks"], got["kv_indices"], got["full_kv_num_blocks"],
                                    got["full_kv_indices"], BLOCK_SIZE=size, mask_mod=mask_mod,
                                    seq_lengths=(width, width), compute_q_blocks=False)
    mask.q_num_blocks, mask.q_indices = got["q_num_blocks"], got["q_indices"]
    mask.full_q_num_blocks, mask.full_q_indices = got["full_q_num_blocks"], got["full_q_indices"]
    assert isinstance(mask, BlockMask) and torch.is_tensor(mask.q_indices)
    return mask


def _documents(batch: dict):
    """Return the (rows, L) document id of every position of a collate batch (see ``block_mask``)."""
    import torch

    if "seq_idx" in batch:
        seq = batch["seq_idx"]
        return seq.view(batch["row_shape"]) if "row_shape" in batch else seq.view(1, -1)
    rows, width = batch["input_ids"].shape
    return (torch.arange(width)[None, :] >= batch["lengths"][:, None]).to(torch.int32)
