"""Megatron-style: megatron-core's own ``IndexedDataset`` reading a plan exported with ``sortpack export``.

    sortpack run corpus.idx -o plan/ --size tokens --max-tokens 4096        # index-only: the plan holds ids
    sortpack export plan/ --to megatron -o export/plan                       # plan order, a micro-batch per document
    python examples/recipes/megatron_indexed.py export/plan --steps 3       # torchrun: each rank its documents

The training side knows nothing of sortpack: megatron-core's ``IndexedDataset(PREFIX)`` reads
the export, whose documents are the plan's micro-batches in plan order, so one document is
one micro-batch of similar lengths (``ds[begin:end]``, megatron-core's slice of a document's
sequences). Rank r of W takes documents ``s * W * A + a * W + r``, the deal
``PackedBatchSampler`` makes (order ``index``): every rank the same number of steps, one step
= W x A consecutive micro-batches of the plan. The tokens are the corpus's ids; this recipe's
tiny model reads byte-level ids (below 256), as the test's corpus holds.
"""
from __future__ import annotations

import argparse
import os
import warnings

import torch
from common import TinyLM, close_process_group, sdpa_padded, token_losses

with warnings.catch_warnings():  # megatron-core warns that Transformer Engine and Apex are absent: CPU
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset


# --- recipe ---
def micro_batches(ds: IndexedDataset, rank: int, world: int, grad_accum: int):
    """Yield (step, last, sequences): this rank's micro-batches, W x A documents a step, in plan order."""
    docs = ds.document_indices  # document k = the plan's micro-batch k: sequences docs[k] .. docs[k + 1]
    per_step = world * grad_accum
    for step in range((len(docs) - 1) // per_step):  # whole steps (a short tail is dropped, as drop_last=True)
        for a in range(grad_accum):
            k = step * per_step + a * world + rank
            yield step, a == grad_accum - 1, ds[int(docs[k]):int(docs[k + 1])]  # megatron-core's slice


def padded(sequences) -> dict:
    """Return a padded batch of token sequences: input_ids, labels (-100: padding, each first token), the mask."""
    lengths = torch.tensor([len(s) for s in sequences])
    ids = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = torch.from_numpy(s.astype("int64"))
    pad = torch.arange(ids.shape[1])[None] >= lengths[:, None]
    labels = ids.masked_fill(pad, -100)
    labels[:, 0] = -100  # nothing predicts a sequence's first token
    return {"input_ids": ids, "labels": labels, "key_padding_mask": pad}


def train(model, ds: IndexedDataset, opt, steps: int, grad_accum: int, rank: int = 0, world: int = 1) -> None:
    """Train for ``steps`` optimizer steps on this rank's micro-batches; print each step's samples, tokens, loss."""
    step_loss, samples, tokens = 0.0, 0, 0
    for step, last, sequences in micro_batches(ds, rank, world, grad_accum):
        if step == steps:
            break
        batch = padded(sequences)
        ids, pad = batch["input_ids"], batch["key_padding_mask"]
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        losses = token_losses(model(ids, positions, sdpa_padded(pad)), batch["labels"])
        loss = losses.sum() / max(1, int((batch["labels"][:, 1:] != -100).sum())) / grad_accum
        loss.backward()
        step_loss, samples, tokens = step_loss + loss.item(), samples + len(sequences), tokens + int((~pad).sum())
        if last:
            opt.step()
            opt.zero_grad()
            print(f"rank {rank} step {step} samples {samples} tokens {tokens} loss {step_loss:.3f}", flush=True)
            step_loss, samples, tokens = 0.0, 0, 0
# --- end recipe ---


def main() -> None:
    """Train for --steps steps on the export PREFIX (under torchrun: each rank its micro-batches, DDP over gloo)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", help="the export's PREFIX (PREFIX.bin, PREFIX.idx)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps to run")
    ap.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step and rank")
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    torch.manual_seed(0)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    ds = IndexedDataset(args.prefix)  # megatron-core's reader of the export
    model = TinyLM(max_len=int(ds.sequence_lengths.max()))
    if world > 1:
        torch.distributed.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    train(model, ds, torch.optim.AdamW(model.parameters(), lr=args.lr), args.steps, args.grad_accum, rank, world)
    if world > 1:
        del model
        close_process_group()


if __name__ == "__main__":
    main()
