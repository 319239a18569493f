"""Plain PyTorch DDP: PackedBatchSampler + pad_collate + VariableBatchSizeLR, gradient accumulation.

    torchrun --nproc_per_node 2 examples/recipes/ddp.py INDEX --steps 3
    (CPU: the gloo backend; on GPUs pass --backend nccl)

Each rank gets its own micro-batches from the sampler (do not add a DistributedSampler),
all-reduces once per optimizer step (``no_sync`` on the other micro-batches) and sets the
LR of every step from the step's global batch, the same number on every rank.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from common import TinyLM, max_len, padded_forward, parser, ref_batch, utf8_bytes
from torch.utils.data import DataLoader

from sortpack.dataset import SourceDataset
from sortpack.torch import PackedBatchSampler, VariableBatchSizeLR, pad_collate


def main() -> None:
    """Train for --steps optimizer steps and print each rank's step, shapes and LR."""
    ap = parser(__doc__)
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", "0")  # run as one process without a launcher
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group(args.backend)  # RANK / WORLD_SIZE from torchrun
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank

    # --- recipe ---
    sampler = PackedBatchSampler(args.index, grad_accum=args.grad_accum, order="shuffle", seed=0)
    loader = DataLoader(SourceDataset(args.index, columns=["text"]), batch_sampler=sampler,
                        num_workers=args.num_workers, collate_fn=pad_collate(tokenize=utf8_bytes))
    model = torch.nn.parallel.DistributedDataParallel(TinyLM(max_len=max_len(sampler.index)))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    sched = VariableBatchSizeLR(warmup, sampler, ref_batch_size=ref_batch(sampler), method="sqrt", by="tokens")

    step, epoch, step_loss_sum = 0, 0, 0.0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            sampler.consume(batch)  # the resume state counts what the loop received
            sched.follow(batch)  # the LR of this batch's step
            last = batch["microbatch"]["last"]  # this rank's last micro-batch of the step
            with contextlib.nullcontext() if last else model.no_sync():  # all-reduce once per step
                loss = padded_forward(model, batch)  # this micro-batch's share of the step's mean loss
                loss.backward()  # not divided by grad_accum: step_loss weighs every token of the step alike
            step_loss_sum += loss.item()
            if last:
                lr = opt.param_groups[0]["lr"]
                opt.step()
                opt.zero_grad()
                sched.step()  # the base schedule; the scale follows the batches
                print(f"rank {rank} step {step} shape {tuple(batch['input_ids'].shape)} lr {lr:.3e} "
                      f"loss {step_loss_sum:.3f}", flush=True)  # this rank's share; the ranks' mean is the step's loss
                step, step_loss_sum = step + 1, 0.0
                if step == args.steps:
                    break
        epoch += 1
    # --- end recipe ---
    del opt, model  # DDP goes before its process group: freed after it, gloo can abort at exit
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
