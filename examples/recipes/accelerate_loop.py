"""``accelerate``: prepare the model and optimizer, keep the sortpack loader as it is.

    python examples/recipes/accelerate_loop.py INDEX --steps 3
    accelerate launch --num_processes 8 examples/recipes/accelerate_loop.py INDEX

Do not pass the DataLoader to ``accelerator.prepare``: the sampler already gives each
process its own micro-batches and accelerate would shard them again. Move batches to the
device yourself. ``accelerator.accumulate`` syncs gradients on every ``grad_accum``-th
micro-batch, which is where the sampler's steps end.
"""
from __future__ import annotations

import torch
from accelerate import Accelerator
from common import TinyLM, max_len, padded_forward, parser, ref_batch, train_batches, utf8_bytes
from torch.utils.data import DataLoader

from sortpack.torch import PackedBatchSampler, SourceDataset, VariableBatchSizeLR, pad_collate


def main() -> None:
    """Train for --steps optimizer steps and print each process's step, shapes and LR."""
    args = parser(__doc__).parse_args()
    torch.manual_seed(0)
    # --- recipe ---
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, cpu=not torch.cuda.is_available())
    sampler = PackedBatchSampler(args.index, rank=accelerator.process_index, world_size=accelerator.num_processes,
                                 grad_accum=args.grad_accum, order="shuffle", seed=0)
    loader = DataLoader(SourceDataset(args.index, columns=["text"]), batch_sampler=sampler,
                        num_workers=args.num_workers, collate_fn=pad_collate(tokenize=utf8_bytes))
    model = TinyLM(max_len=max_len(sampler.index))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, opt = accelerator.prepare(model, opt)  # not the loader
    sched = VariableBatchSizeLR(opt.optimizer, sampler, ref_batch_size=ref_batch(sampler), method="sqrt", by="tokens")

    step_loss_sum = 0.0
    for step, batch in train_batches(sampler, loader, sched, args.steps):  # common.py: epochs, resume state, LR
        batch = {k: v.to(accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        with accelerator.accumulate(model):
            # accelerator.backward divides by grad_accum: step_loss multiplies it back
            loss = padded_forward(model, batch, divided_by=args.grad_accum)
            accelerator.backward(loss)
            step_loss_sum += loss.item() / args.grad_accum
            if accelerator.sync_gradients:  # the last micro-batch of the step
                lr = opt.param_groups[0]["lr"]
            opt.step()  # the prepared optimizer steps only when gradients are synced
            opt.zero_grad()
        if accelerator.sync_gradients:
            sched.step()
            accelerator.print(f"step {step} shape {tuple(batch['input_ids'].shape)} lr {lr:.3e} "
                              f"loss {step_loss_sum:.3f}")
            step_loss_sum = 0.0
    # --- end recipe ---
    accelerator.end_training()


if __name__ == "__main__":
    main()
