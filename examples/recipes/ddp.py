"""Plain PyTorch DDP: PackedBatchSampler + pad_collate + VariableBatchSizeLR, gradient accumulation.

    torchrun --nproc_per_node 2 examples/recipes/ddp.py INDEX --steps 3
    (CPU: the gloo backend; on GPUs pass --backend nccl)

Each rank gets its own micro-batches from the sampler (do not add a DistributedSampler),
all-reduces once per optimizer step (``no_sync`` on the other micro-batches) and sets the
LR of every step from the step's global batch, the same number on every rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from common import (
    TinyLM,
    close_process_group,
    init_process_group,
    max_len,
    padded_forward,
    parser,
    ref_batch,
    train_steps,
    utf8_bytes,
)
from torch.utils.data import DataLoader

from sortpack.torch import PackedBatchSampler, SourceDataset, VariableBatchSizeLR, pad_collate


def main() -> None:
    """Train for --steps optimizer steps and print each rank's step, shapes and LR."""
    ap = parser(__doc__)
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()
    init_process_group(args.backend)
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

    train_steps(model, sampler, loader, opt, sched, args.steps,  # common.py: the loop every recipe shares
                forward=lambda model, batch, n: padded_forward(model, batch),
                describe=lambda batch: f"shape {tuple(batch['input_ids'].shape)}", prefix=f"rank {rank} ")
    # --- end recipe ---
    del opt, model  # DDP goes before its process group
    close_process_group()


if __name__ == "__main__":
    main()
