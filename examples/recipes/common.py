"""What every recipe shares: a tiny byte-level causal LM with a pluggable attention, the loss, the CLI.

The recipes differ only in how a micro-batch reaches the model (padded rows, packed rows
with a document mask, or concatenated varlen segments) and in the training framework.
Tokens are UTF-8 bytes of the ``text`` column, so nothing is downloaded; build the index
over ``text`` with ``--size bytes`` (sizes in characters, the default ``length``, also work,
but then a non-ASCII text has more tokens than the plan counted and the loss is not the
step's exact mean: ``step_loss`` warns). The loss of every recipe is ``step_loss``: each
micro-batch's summed per-token losses over the step's target count (from the plan), so a
step's gradient is the mean over its tokens at any world size and accumulation. Every
loop takes its micro-batches from ``train_batches`` (epochs, the resume state, the LR of
the batch's step); ``train_tiny.py`` and the recipes share the model, and the DDP scripts
``close_process_group``.
"""
from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sortpack.reader import PackedIndex
from sortpack.torch import step_loss

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

    def __init__(self, max_len: int, dim: int = 32, heads: int = 2, layers: int = 2):
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


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Return the per-token next-byte cross entropy (0 where no target) for labels aligned to the inputs.

    ``labels`` is the collate's (-100 at padding and at each document's first token);
    position t predicts ``labels[t + 1]``, the shift Hugging Face causal LMs make.
    """
    targets = F.pad(labels[..., 1:], (0, 1), value=-100)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none", ignore_index=-100)


def padded_token_losses(model, batch) -> torch.Tensor:
    """Return the per-token losses of a ``pad_collate`` batch (input_ids, key_padding_mask, labels)."""
    ids, pad = batch["input_ids"], batch["key_padding_mask"]
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    return token_losses(model(ids, positions, sdpa_padded(pad)), batch["labels"])


def padded_forward(model, batch, divided_by: int = 1) -> torch.Tensor:
    """Return a ``pad_collate`` batch's share of its step's mean loss (``step_loss``; backward on it as is)."""
    return step_loss(padded_token_losses(model, batch), batch, divided_by=divided_by)


def max_len(index) -> int:
    """Return the longest sequence the plan's micro-batches hold (the position table's size), for any plan."""
    ix = index if isinstance(index, PackedIndex) else PackedIndex(index)
    return max(1, int(ix["padded_size"].max(initial=1)))


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
    """Return the reference batch of the LR rule: the mean tokens per step of an epoch.

    The loss is ``step_loss``, a mean over the step's tokens, so the LR scales with the
    step's tokens (``VariableBatchSizeLR(..., by="tokens")``): scaled by samples, a step of
    many short samples (empty files, one-line modules) would train at several times the LR
    of the median step although it holds few tokens.
    """
    tokens = int(sampler.index["tokens"].sum())
    return max(1, round(tokens / max(1, sampler.steps_per_epoch)))


# --- recipe ---
def train_batches(sampler, loader, sched, steps: int):
    """Yield (step, micro-batch) epoch after epoch until ``steps`` optimizer steps have ended.

    A step ends with this rank's last micro-batch of it (``batch["microbatch"]["last"]``),
    where the loop steps the optimizer. ``sched`` is the ``VariableBatchSizeLR``.
    """
    step, epoch = 0, 0
    while step < steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            sampler.consume(batch)  # the resume state counts what the loop received
            sched.follow(batch)  # the LR of this batch's step
            yield step, batch
            if batch["microbatch"]["last"]:  # this rank's last micro-batch of the step
                step += 1
                if step == steps:
                    return
        epoch += 1


def train_steps(model, sampler, loader, opt, sched, steps: int, forward, describe, prefix: str = "") -> None:
    """Train for ``steps`` optimizer steps; print each step's ``describe(batch)``, LR and summed loss.

    ``forward(model, batch, n)`` returns the n-th micro-batch's share of its step's mean loss
    (``step_loss``). A DDP model all-reduces on a step's last micro-batch only (``no_sync``).
    """
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    step_loss_sum = 0.0
    for n, (step, batch) in enumerate(train_batches(sampler, loader, sched, steps)):
        last = batch["microbatch"]["last"]
        with contextlib.nullcontext() if last or not ddp else model.no_sync():  # all-reduce once per step
            loss = forward(model, batch, n)
            loss.backward()  # not divided by grad_accum: step_loss weighs every token of the step alike
        step_loss_sum += loss.item()
        if last:
            lr = opt.param_groups[0]["lr"]
            opt.step()
            opt.zero_grad()
            sched.step()  # the base schedule; the scale follows the batches
            print(f"{prefix}step {step} {describe(batch)} lr {lr:.3e} loss {step_loss_sum:.3f}",
                  flush=True)  # under DDP this rank's share: the ranks' mean is the step's loss
            step_loss_sum = 0.0
# --- end recipe ---


def init_process_group(backend: str) -> None:
    """Join the process group (``RANK``/``WORLD_SIZE`` from torchrun; one process of one without a launcher)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group(backend)


def close_process_group() -> None:
    """Wait for every rank, then tear the process group down (delete the DDP model first).

    DDP goes before its process group: freed after it, gloo can abort at exit; the barrier
    keeps a rank from tearing gloo down while another still talks to it.
    """
    dist.barrier()
    dist.destroy_process_group()
