"""One rank of the DDP noise-scale check in test_goodput_torch.py (run as a script, 2 gloo ranks).

Linear regression at a fixed point (lr 0) over a real index; prints the exact noise scale
over the dataset and the controller's average estimate.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from sortpack.torch import GoodputController, PackedBatchSampler


def main() -> None:
    """Run 200 steps of 2-rank DDP with accumulation argv[2] and print 'truth T estimate E'."""
    index, accum = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n, d = 4096, 8
    x = torch.from_numpy(rng.standard_normal((n, d)))
    w = torch.from_numpy(rng.standard_normal(d))
    y = x @ w + torch.from_numpy(rng.normal(0.0, 1.0, n))
    w0 = w + 0.3
    g = x * (x @ w0 - y)[:, None]
    mean = g.mean(0)
    truth = float((g - mean).pow(2).sum(1).mean() / mean.pow(2).sum())
    model = torch.nn.Linear(d, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(w0[None])
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sampler = PackedBatchSampler(index, rank=rank, world_size=2, grad_accum=accum, order="shuffle")
    ctl = GoodputController(model, sampler, opt, min_accum=accum, max_accum=accum)
    done, epoch = 0, 0
    while done < 200:
        sampler.set_epoch(epoch)
        for mb in sampler:
            ids = torch.as_tensor(np.asarray(mb, dtype=np.int64))
            loss = 0.5 * ((model(x[ids])[:, 0] - y[ids]) ** 2).mean()
            if ctl.backward(loss, len(ids)):
                opt.step()
                opt.zero_grad()
                done += 1
                if done == 200:
                    break
        epoch += 1
    values = [h["noise_scale"] for h in ctl.history]
    print(f"rank {rank} truth {truth} estimate {np.mean(values[20:])}", flush=True)
    del ctl, opt, model  # DDP goes before its process group: freed after it, gloo can abort at exit
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Skip interpreter finalization. Gloo's worker threads can still hold the comm hook's
    # last async work, and releasing it during finalization aborts the process ("terminate
    # called without an active exception", pytorch/pytorch#179291). CI saw this once per
    # few dozen runs, even with the model freed before the process group. The figures are
    # printed by then.
    sys.stdout.flush()
    os._exit(0)
