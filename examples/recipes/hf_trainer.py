"""Hugging Face ``Trainer``: a subclass that feeds sortpack micro-batches and scales the LR per step.

    python examples/recipes/hf_trainer.py INDEX --steps 3
    torchrun --nproc_per_node 8 examples/recipes/hf_trainer.py INDEX   (one process per GPU)

``get_train_dataloader`` returns a DataLoader over ``PackedBatchSampler`` *without*
``accelerator.prepare``: the sampler already gives each rank its own micro-batches, and
accelerate would shard them a second time. ``create_scheduler`` wraps the usual schedule in
``VariableBatchSizeLR``, which the Trainer steps once per optimizer step.
"""
from __future__ import annotations

import tempfile

import torch
from common import TinyLM, max_len, padded_forward, parser, ref_batch, utf8_bytes
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments, get_scheduler

from sortpack.torch import PackedBatchSampler, SourceDataset, VariableBatchSizeLR, pad_collate


class LM(torch.nn.Module):
    """TinyLM returning ``{"loss": ...}`` from a ``pad_collate`` batch, as the Trainer expects."""

    accepts_loss_kwargs = False  # the loss is already the step's token mean: no num_items_in_batch rescaling

    def __init__(self, max_len: int):
        super().__init__()
        self.lm = TinyLM(max_len=max_len)

    def forward(self, **batch):
        """Return the batch's share of its step's mean loss (``step_loss``) in a dict."""
        return {"loss": padded_forward(self.lm, batch)}


# --- recipe ---
class EpochLoader(DataLoader):
    """A DataLoader whose ``set_epoch`` (the Trainer calls it every epoch) reaches the sampler."""

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` of the batch sampler."""
        self.batch_sampler.set_epoch(epoch)


class PackedTrainer(Trainer):
    """A Trainer that trains on a sortpack index: its micro-batches and its per-step LR scale."""

    loss_is_scaled_for_ga = True  # the model returns step_loss: the Trainer must not divide it by the accumulation

    def __init__(self, *args, index: str, ref_batch_size: float | None = None, lr_method: str = "sqrt",
                 **kwargs):
        super().__init__(*args, **kwargs)
        world = self.args.world_size  # rank/world from the launcher, as the Trainer sees them
        self.packed_sampler = PackedBatchSampler(index, rank=self.args.process_index, world_size=world,
                                                 grad_accum=self.args.gradient_accumulation_steps,
                                                 order="shuffle", seed=self.args.seed)
        self.ref_batch_size = ref_batch_size or ref_batch(self.packed_sampler)
        self.lr_method = lr_method

    def get_train_dataloader(self) -> DataLoader:
        """Return the rank's loader over the index (not passed through accelerator.prepare)."""
        return EpochLoader(SourceDataset(self.packed_sampler.index, columns=["text"]),
                           batch_sampler=self.packed_sampler, num_workers=self.args.dataloader_num_workers,
                           collate_fn=pad_collate(tokenize=utf8_bytes))

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """Return the configured schedule wrapped in VariableBatchSizeLR."""
        if self.lr_scheduler is None:
            base = get_scheduler(self.args.lr_scheduler_type, optimizer=optimizer or self.optimizer,
                                 num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
                                 num_training_steps=num_training_steps)
            self.lr_scheduler = VariableBatchSizeLR(base, self.packed_sampler, self.ref_batch_size,
                                                    method=self.lr_method, by="tokens")
        return self.lr_scheduler
# --- end recipe ---


def main() -> None:
    """Train for --steps optimizer steps with the Trainer and print the LR of every step."""
    args = parser(__doc__).parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, max_steps=args.steps, learning_rate=args.lr,
                                  gradient_accumulation_steps=args.grad_accum, lr_scheduler_type="constant",
                                  dataloader_num_workers=args.num_workers, logging_steps=1, save_strategy="no",
                                  report_to=[], use_cpu=not torch.cuda.is_available(), disable_tqdm=True)
        trainer = PackedTrainer(model=LM(max_len=max_len(args.index)), args=targs, index=args.index)
        result = trainer.train()
        for rec in trainer.state.log_history:
            if "learning_rate" in rec:
                print(f"step {rec['step']} lr {rec['learning_rate']:.3e} loss {rec['loss']:.3f}", flush=True)
        print(f"trained {trainer.state.global_step} steps, final loss {result.training_loss:.3f}")


if __name__ == "__main__":
    main()
