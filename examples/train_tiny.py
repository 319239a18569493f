"""Train a tiny byte-level transformer on a sortpack index for a few steps (CPU, gloo).

    torchrun --nproc_per_node 2 examples/train_tiny.py INDEX --steps 4
    mpiexec -n 2 python examples/train_tiny.py INDEX --steps 4
    torchrun --nproc_per_node 2 examples/train_tiny.py INDEX --steps 40 --goodput

With ``--goodput`` a ``GoodputController`` picks the gradient accumulation of every step
from the gradient noise scale (between 1 and ``--max-accum``) and the run ends with the
noise scale and the chosen accumulation over training.

The index must have been built over a column ``text`` with sizes = character length
(``sortpack run data/ -o INDEX --column text --max-tokens 2048``). Tokens are UTF-8 bytes,
so nothing is downloaded; a sample with multi-byte characters is cut to the micro-batch's
``padded_size``. Rank and world size come from RANK/WORLD_SIZE (torchrun), else from the MPI
launcher's environment (``sortpack.launcher``: mpiexec, srun); MASTER_ADDR/MASTER_PORT default to
127.0.0.1:29500.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from recipes.common import PAD, TinyLM, close_process_group, train_batches, utf8_bytes
from torch import nn
from torch.utils.data import DataLoader

from sortpack.torch import GoodputController, PackedBatchSampler, SourceDataset, VariableBatchSizeLR, pad_collate


def lm_loss(logits, targets):
    """Return the mean next-byte cross entropy over the micro-batch's real tokens."""
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 256), targets.reshape(-1), ignore_index=-100,
                           reduction="sum")
    return loss / max(1, int((targets != -100).sum()))


def rank_and_world() -> tuple[int, int]:
    """Return (rank, world size) from the launcher's environment."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    from sortpack.launcher import launcher_rank, launcher_size

    return launcher_rank(), launcher_size()[0]


def attend_under(mask: torch.Tensor):
    """Return an attention function (``common.TinyLM``'s) for a per-sample (B, T, T) mask (True = may attend)."""
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
    return attend


def main() -> None:
    """Train for ``--steps`` optimizer steps, printing each rank's shapes, tokens and LR per step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps to run")
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--order", default="shuffle", choices=["index", "shuffle", "curriculum"])
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3, help="LR at the reference batch")
    parser.add_argument("--method", default="sqrt", choices=["linear", "sqrt", "none"])
    parser.add_argument("--goodput", action="store_true", help="adapt the accumulation to the noise scale")
    parser.add_argument("--max-accum", type=int, default=8, help="largest accumulation --goodput may pick")
    args = parser.parse_args()

    rank, world = rank_and_world()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    sampler = PackedBatchSampler(args.index, rank=rank, world_size=world, grad_accum=args.grad_accum,
                                 order=args.order, seed=0)
    dataset = SourceDataset(args.index, columns=["text"])
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers,
                        collate_fn=pad_collate(pad_id=PAD, tokenize=utf8_bytes, attn_mask="causal"))
    max_len = int(sampler.index["padded_size"].max(initial=1))
    model = nn.parallel.DistributedDataParallel(TinyLM(max_len=max_len))  # recipes/common.py's model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 10))
    # the loss is a mean over tokens: the LR scales with the step's tokens, from the mean step's
    ref = max(1, round(int(sampler.index["tokens"].sum()) / max(1, sampler.steps_per_epoch)))
    sched = VariableBatchSizeLR(warmup, sampler, ref_batch_size=ref, method=args.method, by="tokens")
    ctl = None
    if args.goodput:  # three lines turn it on: this one, ctl.backward, and stepping when it says so
        ctl = GoodputController(model, sampler, opt, by="tokens", min_accum=1 if world > 1 else 2,
                                max_accum=args.max_accum, warmup_steps=4, interval=2)

    shapes, tokens = [], 0
    for step, batch in train_batches(sampler, loader, sched, args.steps):  # recipes/common.py: epochs, resume, LR
        ids, mask = batch["input_ids"], batch["attn_mask"]
        targets = ids[:, 1:].masked_fill(batch["key_padding_mask"][:, 1:], -100)
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        if ctl is not None:
            accum = ctl.grad_accum
            loss = lm_loss(model(ids, positions, attend_under(mask)), targets)
            sync = ctl.backward(loss, batch)  # loss / A, no_sync but on the last micro-batch
        else:
            accum, sync = args.grad_accum, batch["microbatch"]["last"]
            with contextlib.nullcontext() if sync else model.no_sync():  # all-reduce once per step
                loss = lm_loss(model(ids, positions, attend_under(mask)), targets)
                (loss / args.grad_accum).backward()
        shapes.append(tuple(ids.shape))
        tokens += int(batch["lengths"].sum())
        if sync:
            lr = opt.param_groups[0]["lr"]
            opt.step()
            opt.zero_grad()
            sched.step()
            extra = "" if ctl is None else f" grad_accum {accum} noise_scale {ctl.noise_scale:.1f}"
            print(f"rank {rank} step {step}: batch shapes {shapes} tokens {tokens} lr {lr:.3e} "
                  f"loss {loss.item():.3f}{extra}", flush=True)
            shapes, tokens = [], 0
    if ctl is not None and rank == 0:
        noise = " ".join(f"{h['noise_scale']:.0f}" for h in ctl.history)
        chosen = " ".join(str(h["grad_accum"]) for h in ctl.history)
        print(f"goodput: noise scale (tokens) per step: {noise}\ngoodput: grad_accum per step: {chosen}")
    del ctl, opt, model  # DDP goes before its process group
    close_process_group()


if __name__ == "__main__":
    main()
    # With --goodput the controller's DDP comm hook leaves gloo an async work that it may
    # release during interpreter finalization and abort ("terminate called without an active
    # exception", pytorch/pytorch#179291). Everything is written by now: skip finalization.
    sys.stdout.flush()
    os._exit(0)
