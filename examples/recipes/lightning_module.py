"""PyTorch Lightning: ``PlanDataModule`` deals the plan to the Trainer's ranks; the LR follows each step.

    python examples/recipes/lightning_module.py INDEX --steps 3
    (multi-GPU: Trainer(devices=8, strategy="ddp"); resume: trainer.fit(..., ckpt_path=...), any device count)

``sortpack.lightning.PlanDataModule`` makes the rank's sampler from the Trainer (rank, world
size, ``accumulate_grad_batches``) and hands Lightning a loader that is not a ``DataLoader``,
so Lightning puts no ``DistributedSampler`` around it (``use_distributed_sampler`` may stay
on). Its state rides in every checkpoint: ``fit(ckpt_path=...)`` resumes mid-epoch, on
another number of devices too. Lightning steps a scheduler it does not know through
``lr_scheduler_step``, once per optimizer step (``interval: step``).
"""
from __future__ import annotations

import lightning as L
import torch
from common import TinyLM, max_len, padded_forward, parser, ref_batch, utf8_bytes

from sortpack.lightning import PlanDataModule
from sortpack.torch import VariableBatchSizeLR, pad_collate


# --- recipe ---
def plan_data(index: str) -> PlanDataModule:
    """Return the plan's batches for a Trainer: texts as byte ids, padded to each micro-batch's shape."""
    return PlanDataModule(index, pad_collate(tokenize=utf8_bytes), columns=["text"], order="shuffle", seed=0)


class PackedLM(L.LightningModule):
    """TinyLM trained on a sortpack plan with ``grad_accum`` micro-batches per step."""

    def __init__(self, index: str, grad_accum: int, lr: float):
        super().__init__()
        self.grad_accum, self.lr = grad_accum, lr
        self.model = TinyLM(max_len=max_len(index))  # the plan's longest micro-batch

    def training_step(self, batch, batch_idx):
        """Return the micro-batch's share of its step's mean loss (Lightning divides it by grad_accum)."""
        return padded_forward(self.model, batch, divided_by=self.grad_accum)

    def configure_optimizers(self):
        """Return AdamW and the per-step VariableBatchSizeLR over the data module's sampler."""
        sampler = self.trainer.datamodule.sampler  # made in the data module's setup(), before this
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = VariableBatchSizeLR(opt, sampler, ref_batch_size=ref_batch(sampler), method="sqrt", by="tokens")
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def lr_scheduler_step(self, scheduler, metric) -> None:
        """Step VariableBatchSizeLR (not a torch LRScheduler, so Lightning asks us to)."""
        scheduler.step()

    def on_before_optimizer_step(self, optimizer) -> None:
        """Remember the LR this optimizer step uses (the scheduler sets the next one right after)."""
        self.step_lr = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """Print the step, shape and LR at the end of every optimizer step."""
        if (batch_idx + 1) % self.grad_accum == 0:
            print(f"step {self.global_step - 1} shape {tuple(batch['input_ids'].shape)} "
                  f"lr {self.step_lr:.3e} loss {outputs['loss'].item():.3f}", flush=True)
# --- end recipe ---


def main() -> None:
    """Train for --steps optimizer steps with a Lightning Trainer."""
    args = parser(__doc__).parse_args()
    torch.manual_seed(0)
    trainer = L.Trainer(max_steps=args.steps, accumulate_grad_batches=args.grad_accum, accelerator="auto",
                        devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(PackedLM(args.index, args.grad_accum, args.lr), datamodule=plan_data(args.index))
    print(f"trained {trainer.global_step} steps")


if __name__ == "__main__":
    main()
