"""RL batches planned in memory: each step's rollouts packed and dealt with ``sortpack.plan_batch``, trained with DDP.

    torchrun --nproc_per_node 2 examples/recipes/rl_batches.py --steps 3
    (CPU: the gloo backend; on GPUs pass --backend nccl)

No plan on disk: every step generates rollouts of a realistic shape (a log-normal prompt plus a
log-normal response; random token ids, no model generates them here), and every rank plans the
same batch with ``plan_batch`` (the same input gives the same plan: nothing is broadcast). Each
rank gets the same number of micro-batches, none over ``--max-tokens``, their compute balanced;
``varlen_collate`` lays each out and ``step_loss`` divides by the step's loss targets over all
ranks (the responses' tokens: the prompts' labels are -100), so the gradient is the step's exact
mean. Each step prints the plan's balance and every rank's share.
"""
from __future__ import annotations

import argparse
import contextlib

import numpy as np
import torch
import torch.distributed as dist
from common import TinyLM, close_process_group, init_process_group, token_losses
from varlen_rows import varlen_attention

from sortpack import plan_batch
from sortpack.reader import Samples
from sortpack.torch import step_loss, varlen_collate


# --- recipe ---
def rollouts(step: int, n: int, longest: int) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """Return step ``step``'s rollouts (token ids, labels -100 on the prompt), their lengths and their targets."""
    rng = np.random.default_rng(step)  # the same rollouts on every rank: each plans the same batch
    prompt = np.clip(np.rint(rng.lognormal(np.log(40), 0.6, n)), 2, longest // 2).astype(np.int64)
    response = np.clip(np.rint(rng.lognormal(np.log(150), 1.0, n)), 1, longest - prompt).astype(np.int64)
    items = []
    for p, r in zip(prompt.tolist(), response.tolist()):
        ids = rng.integers(1, 256, p + r).tolist()
        items.append({"input_ids": ids, "labels": [-100] * p + ids[p:]})
    return items, prompt + response, response


def train_step(model, opt, items, plan, rank: int) -> float:
    """Train one step on this rank's micro-batches of ``plan``; return this rank's share of the step's mean loss."""
    collate = varlen_collate(key="input_ids")
    mbs = plan.microbatches(rank)  # the same count on every rank: DDP's all-reduces pair up
    total = 0.0
    for mb in mbs:
        batch = collate(Samples([items[i] for i in mb], mb))
        attend = varlen_attention(batch["cu_seqlens"], batch["max_seqlen"])
        logits = model(batch["input_ids"][None], batch["position_ids"][None], attend)
        loss = step_loss(token_losses(logits, batch["labels"][None]), batch)  # over the step's targets, all ranks
        with model.no_sync() if not mb.last else contextlib.nullcontext():
            loss.backward()
        total += float(loss.detach())
    opt.step()
    opt.zero_grad()
    return total
# --- end recipe ---


def main() -> None:
    """Train for --steps steps; print each step's plan and each rank's micro-batches, tokens and loss."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps (one batch of rollouts each)")
    ap.add_argument("--rollouts", type=int, default=48, help="rollouts per step over all ranks")
    ap.add_argument("--max-tokens", type=int, default=1024, help="tokens a micro-batch holds at most")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()
    init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(TinyLM(max_len=args.max_tokens))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        items, lengths, targets = rollouts(step, args.rollouts, args.max_tokens)
        plan = plan_batch(lengths, world_size=world, max_tokens=args.max_tokens, targets=targets, cost_coeff=192.0)
        share = train_step(model, opt, items, plan, rank)
        mine = [int(lengths[mb].sum()) for mb in plan.rank(rank)]
        mean = torch.tensor([share], dtype=torch.float64)
        dist.all_reduce(mean)  # the ranks' shares sum to W x the step's mean loss
        s = plan.stats
        if rank == 0:
            print(f"step {step} plan {s['microbatches']} micro-batches (bound {s['lower_bound']}) "
                  f"imbalance cost {s['imbalance']['cost']:.4f} tokens {s['imbalance']['tokens']:.4f} "
                  f"targets {s['targets']} loss {float(mean) / world:.4f}", flush=True)
        print(f"rank {rank} step {step} micro-batches {len(mine)} tokens {sum(mine)} largest {max(mine)}",
              flush=True)
    del opt, model  # DDP goes before its process group
    close_process_group()


if __name__ == "__main__":
    main()
