"""What every recipe shares: a tiny byte-level causal LM with a pluggable attention, the loss, the CLI.

The recipes differ only in how a micro-batch reaches the model (padded rows, packed rows
with a document mask, or concatenated varlen segments) and in the training framework.
Tokens are UTF-8 bytes of the ``text`` column, so nothing is downloaded; the index must
be built over ``text`` with ``--size length`` (characters) or ``--size bytes``.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
PAD = 0  # byte 0 does not occur in text


def utf8_bytes(row: dict) -> bytes:
    """Return the byte-level tokens of a row (module level, so DataLoader workers can pickle it)."""
    return row["text"].encode("utf-8")


def sdpa_padded(key_padding_mask: torch.Tensor):
    """Return an attention function for padded (B, T) batches: causal, padding keys masked."""
    t = key_padding_mask.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    allowed = causal[None] & ~key_padding_mask[:, None, :]
    allowed |= torch.eye(t, dtype=torch.bool)[None]  # a padding query sees itself: no empty softmax row

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
    return attend


class Block(nn.Module):
    """One pre-norm transformer block; ``attend(q, k, v)`` maps (B, H, T, Dh) to (B, H, T, Dh)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, attend):
        """Return the block's output for x (B, T, D)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.out(attend(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A byte-level causal LM (``layers`` blocks of width ``dim``) for sequences up to ``max_len``."""

    def __init__(self, dim: int = 32, heads: int = 2, layers: int = 2, max_len: int = 4096):
        super().__init__()
        self.embed, self.pos = nn.Embedding(VOCAB, dim), nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids, position_ids, attend):
        """Return next-byte logits (B, T, 256) for ids and position_ids (B, T)."""
        x = self.embed(ids) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x, attend)
        return self.head(x)


def lm_loss(logits: torch.Tensor, ids: torch.Tensor, target_ok: torch.Tensor) -> torch.Tensor:
    """Return the mean next-token cross entropy over positions t whose target ids[t+1] is real (target_ok[t+1])."""
    targets = ids[..., 1:].masked_fill(~target_ok[..., 1:], -100)
    return F.cross_entropy(logits[..., :-1, :].reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)


def padded_forward(model, batch) -> torch.Tensor:
    """Return the loss of a ``pad_collate`` batch (input_ids, key_padding_mask)."""
    ids, pad = batch["input_ids"], batch["key_padding_mask"]
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    return lm_loss(model(ids, positions, sdpa_padded(pad)), ids, ~pad)


def parser(doc: str) -> argparse.ArgumentParser:
    """Return the command line every recipe shares: INDEX, --steps, --grad-accum, --lr, --num-workers."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("index", help="a sortpack index over a `text` column (sizes in characters or bytes)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps to run")
    ap.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step and rank")
    ap.add_argument("--lr", type=float, default=1e-3, help="LR at the reference batch size")
    ap.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    return ap


def ref_batch(sampler) -> int:
    """Return a reference batch size for the LR: the mean samples per step of an epoch."""
    return max(1, round(sampler.index.num_samples / max(1, sampler.steps_per_epoch)))
