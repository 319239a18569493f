"""A tiny float64 causal LM and the per-micro-batch loss for the token-exact loss tests (also the gloo worker's)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sortpack.torch import PackedDataset, pad_collate, step_loss, varlen_collate

VOCAB = 50


def tokens_of(sample_id: int, size: int) -> np.ndarray:
    """Return the token ids of a sample: ``size`` ids drawn from a generator seeded by its id."""
    return np.random.default_rng(sample_id).integers(1, VOCAB, size=size)


def dataset(sizes) -> PackedDataset:
    """Return the samples (token ids of the index's sizes) as a map-style dataset."""
    return PackedDataset({i: tokens_of(i, int(n)) for i, n in enumerate(sizes)})


class TinyCausalLM(nn.Module):
    """Embedding + position embedding, one masked attention layer, an MLP and a head, in float64."""

    def __init__(self, dim: int = 8, max_len: int = 128):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.pos = nn.Embedding(VOCAB, dim), nn.Embedding(max_len, dim)
        self.qkv, self.mlp, self.head = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.Linear(dim, VOCAB)
        self.double()

    def forward(self, ids, positions, allowed):
        """Return logits (B, T, V) for ids and positions (B, T) under the boolean mask allowed (B, T, T)."""
        x = self.embed(ids) + self.pos(positions)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.head(x + torch.tanh(self.mlp(x)))


def padded_token_losses(model, batch):
    """Return the per-token losses (0 without a target) of a ``pad_collate`` batch."""
    ids, pad = batch["input_ids"], batch["key_padding_mask"]
    t = ids.shape[1]
    allowed = torch.ones(t, t, dtype=torch.bool).tril()[None] & ~pad[:, None, :]
    allowed |= torch.eye(t, dtype=torch.bool)[None]
    logits = model(ids, torch.arange(t).expand_as(ids), allowed)
    return shifted_losses(logits, batch["labels"])


def rows_token_losses(model, batch):
    """Return the per-token losses of a rows-mode ``varlen_collate`` batch under a causal document mask."""
    shape = batch["row_shape"]
    ids, positions, labels = (batch[k].view(shape) for k in ("input_ids", "position_ids", "labels"))
    doc = batch["seq_idx"].view(shape)
    t = shape[1]
    allowed = (doc[:, :, None] == doc[:, None, :]) & torch.ones(t, t, dtype=torch.bool).tril()[None]
    return shifted_losses(model(ids, positions, allowed), labels)


def shifted_losses(logits, labels):
    """Return the next-token losses of logits for labels aligned to the inputs (-100: no target), as HF shifts."""
    targets = F.pad(labels[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none", ignore_index=-100)


def collate_and_losses(mode: str, key: str | None = None):
    """Return (collate_fn, per-token loss function) of a packing mode: padded or rows (``key``: a stored column)."""
    if mode == "rows":
        return varlen_collate(key=key), rows_token_losses
    return pad_collate(key=key), padded_token_losses


def accumulate(model, loader, mode: str, steps: int, no_sync=None) -> list[list[np.ndarray]]:
    """Train nothing: return the gradients of each of the first ``steps`` steps (step_loss, summed over A)."""
    _, losses = collate_and_losses(mode)
    grads, step = [], 0
    model.zero_grad()
    for batch in loader:
        last = batch["microbatch"]["last"]
        ctx = no_sync() if (no_sync is not None and not last) else _null()
        with ctx:
            step_loss(losses(model, batch), batch).backward()
        if last:
            grads.append([p.grad.detach().numpy().copy() for p in model.parameters()])
            model.zero_grad()
            step += 1
            if step == steps:
                break
    return grads


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
