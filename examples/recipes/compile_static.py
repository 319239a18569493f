"""``torch.compile`` with static shapes: an index packed to a few shapes, every shape compiled up front.

    sortpack run data/ -o INDEX --column text --max-tokens 32768 --shapes 256,512,1024,2048,4096
    python examples/recipes/compile_static.py INDEX --steps 20

``--shapes`` rounds every micro-batch's padded length up to a listed length, so the index
has a handful of ``(batch_size, padded_size)`` shapes (``sortpack inspect`` prints
``distinct_shapes``). ``warmup_shapes=True`` puts a step of every shape at the start of each
epoch, largest first, so all compiles happen in the first ``distinct_shapes`` steps (and an
out-of-memory shows at once). ``dynamic=False`` makes each shape one specialised graph;
dynamo's recompile limit (8 graphs per frame by default) must cover them all, or later
shapes silently run eagerly.
"""
from __future__ import annotations

import time

import torch
import torch._dynamo
import torch._dynamo.utils
from common import TinyLM, max_len, padded_token_losses, parser, ref_batch, utf8_bytes
from torch.utils.data import DataLoader

from sortpack.torch import PackedBatchSampler, SourceDataset, VariableBatchSizeLR, pad_collate, step_loss


def main() -> None:
    """Train for --steps steps; print each step's shapes, whether it compiled and its time."""
    ap = parser(__doc__)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: fast compiles, for "
                                                          "checking the recipe on a CPU)")
    args = ap.parse_args()
    torch.manual_seed(0)
    # --- recipe ---
    sampler = PackedBatchSampler(args.index, grad_accum=args.grad_accum, order="shuffle", seed=0,
                                 warmup_shapes=True)
    shapes = set(zip(sampler.index["batch_size"].tolist(), sampler.index["padded_size"].tolist()))
    torch._dynamo.config.recompile_limit = max(8, len(shapes))  # one graph per shape, none dropped
    loader = DataLoader(SourceDataset(args.index, columns=["text"]), batch_sampler=sampler,
                        num_workers=args.num_workers, collate_fn=pad_collate(tokenize=utf8_bytes))
    model = TinyLM(max_len=max_len(sampler.index))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = VariableBatchSizeLR(opt, sampler, ref_batch_size=ref_batch(sampler), method="sqrt", by="tokens")
    # compile the model and the per-token losses; step_loss (the step's counts, new every step) stays outside
    step_fn = torch.compile(padded_token_losses, dynamic=False, backend=args.backend)

    seen: set = set()
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        t0, step_shapes, new, step_loss_sum = time.perf_counter(), [], 0, 0.0
        for batch in loader:
            sampler.consume(batch)  # the resume state counts what the loop received
            sched.follow(batch)  # the LR of this batch's step
            shape = tuple(batch["input_ids"].shape)
            new += shape not in seen  # a shape not seen before compiles a graph now
            seen.add(shape)
            step_shapes.append(shape)
            loss = step_loss(step_fn(model, batch), batch)  # this micro-batch's share of the step's mean loss
            loss.backward()
            step_loss_sum += loss.item()
            if batch["microbatch"]["last"]:  # this rank's last micro-batch of the step
                opt.step()
                opt.zero_grad()
                sched.step()
                print(f"step {step} shapes {step_shapes} new {new} seen {len(seen)}/{len(shapes)} "
                      f"time {time.perf_counter() - t0:.2f} s loss {step_loss_sum:.3f}", flush=True)
                step, t0, step_shapes, new, step_loss_sum = step + 1, time.perf_counter(), [], 0, 0.0
                if step == args.steps:
                    break
        epoch += 1
    # --- end recipe ---
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # graphs dynamo compiled
    print(f"distinct shapes {len(shapes)}, shapes seen {len(seen)}, graphs compiled {graphs}")


if __name__ == "__main__":
    main()
