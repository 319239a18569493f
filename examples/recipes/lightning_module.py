"""PyTorch Lightning: the module's ``train_dataloader`` uses the sortpack sampler; the LR follows each step.

    python examples/recipes/lightning_module.py INDEX --steps 3
    (multi-GPU: Trainer(devices=8, strategy="ddp", use_distributed_sampler=False))

``use_distributed_sampler=False`` keeps Lightning from replacing the batch sampler with a
DistributedSampler: the sortpack sampler already splits the micro-batches by rank. Lightning
steps a scheduler it does not know through ``lr_scheduler_step``, once per optimizer step
(``interval: step``), i.e. every ``accumulate_grad_batches`` micro-batches.
"""
from __future__ import annotations

import lightning as L
import torch
from common import TinyLM, max_len, padded_forward, parser, ref_batch, utf8_bytes
from torch.utils.data import DataLoader

from sortpack.torch import PackedBatchSampler, SourceDataset, VariableBatchSizeLR, pad_collate


# --- recipe ---
class PackedLM(L.LightningModule):
    """TinyLM trained on a sortpack index (``index``) with ``grad_accum`` micro-batches per step."""

    def __init__(self, index: str, grad_accum: int, lr: float, num_workers: int = 0):
        super().__init__()
        self.index, self.grad_accum, self.lr, self.num_workers = index, grad_accum, lr, num_workers
        self.model = TinyLM(max_len=max_len(index))  # the plan's longest micro-batch

    def setup(self, stage: str) -> None:
        """Build the rank's sampler (rank and world size are known here)."""
        self.sampler = PackedBatchSampler(self.index, rank=self.global_rank, world_size=self.trainer.world_size,
                                          grad_accum=self.grad_accum, order="shuffle", seed=0)

    def train_dataloader(self) -> DataLoader:
        """Return the rank's loader over the index."""
        return DataLoader(SourceDataset(self.index, columns=["text"]), batch_sampler=self.sampler,
                          num_workers=self.num_workers, collate_fn=pad_collate(tokenize=utf8_bytes))

    def on_train_epoch_start(self) -> None:
        """Start the sampler's epoch (Lightning calls set_epoch only on samplers it made)."""
        self.sampler.set_epoch(self.current_epoch)

    def training_step(self, batch, batch_idx):
        """Return the micro-batch's share of its step's mean loss (Lightning divides it by grad_accum)."""
        return padded_forward(self.model, batch, divided_by=self.grad_accum)

    def configure_optimizers(self):
        """Return AdamW and the per-step VariableBatchSizeLR."""
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = VariableBatchSizeLR(opt, self.sampler, ref_batch_size=ref_batch(self.sampler), method="sqrt",
                                    by="tokens")
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
    trainer = L.Trainer(max_steps=args.steps, accumulate_grad_batches=args.grad_accum,
                        use_distributed_sampler=False, accelerator="auto", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(PackedLM(args.index, args.grad_accum, args.lr, args.num_workers))
    print(f"trained {trainer.global_step} steps")


if __name__ == "__main__":
    main()
