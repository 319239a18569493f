"""One gloo rank of the token-exact loss test: DDP over the plan's steps, gradients of each step saved by rank 0.

    python tests/train/step_loss_worker.py INDEX SIZES.npy MODE GRAD_ACCUM STEPS OUT.npz   (RANK/WORLD_SIZE set)

SIZES.npy ``-``: the samples are the plan's stored ``input_ids`` with their ``labels``.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist
from step_loss_model import TinyCausalLM, accumulate, collate_and_losses, dataset
from torch.utils.data import DataLoader

from sortpack.reader import PackedIndex
from sortpack.torch import PackedBatchSampler, SourceDataset


def main() -> None:
    """Run the steps under DDP and save rank 0's gradients after each (every rank holds the same)."""
    index, sizes_file, mode, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[6]
    accum, steps = int(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ix = PackedIndex(index)
    stored = sizes_file == "-"
    sampler = PackedBatchSampler(ix, rank=rank, world_size=world, grad_accum=accum)
    collate, _ = collate_and_losses(mode, "input_ids" if stored else None)
    data = SourceDataset(ix) if stored else dataset(np.load(sizes_file))
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=collate)
    model = torch.nn.parallel.DistributedDataParallel(TinyCausalLM())
    grads = accumulate(model, loader, mode, steps, no_sync=model.no_sync)
    if rank == 0:
        np.savez(out, *[g for step in grads for g in step])
    del model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
