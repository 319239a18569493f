"""A Lightning run over a plan through ``PlanDataModule``: the whole epoch, a stop at step 3, or a resume from it.

    python tests/train/lightning_worker.py PLAN DEVICES MODE CKPT OUT_PREFIX

MODE ``whole`` trains the epoch; ``stop`` trains 3 optimizer steps, ``ModelCheckpoint`` saving
CKPT after the third (the middle of the epoch, where a preempted job resumes); ``resume``
continues the epoch from CKPT (``Trainer.fit(ckpt_path=...)``) on DEVICES CPU devices. Every
rank writes the micro-batches it trained on (number, epoch, repeat, sample ids) to
OUT_PREFIX-rank{R}.json. Two or more devices run Lightning's own ``ddp`` (gloo) processes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from sortpack.lightning import PlanDataModule
from sortpack.torch import pad_collate

ACCUM = 2


def utf8(row) -> list[int]:
    """Return a row's text as byte ids."""
    return list(row["text"].encode())


class Counting(L.LightningModule):
    """A tiny model whose training step records the micro-batch it was given."""

    def __init__(self, out: str):
        super().__init__()
        self.out, self.seen = out, []
        self.embed = torch.nn.Embedding(256, 4)

    def training_step(self, batch, batch_idx):
        """Return a loss over the batch's tokens; remember the micro-batch."""
        info = batch["microbatch"]
        self.seen.append([info["microbatch"], info["epoch"], info["repeat"],
                          batch["sample_ids"][batch["real"]].tolist()])
        return self.embed(batch["input_ids"]).pow(2).mean()

    def on_train_end(self) -> None:
        """Write the micro-batches this rank trained on."""
        with open(f"{self.out}-rank{self.global_rank}.json", "w") as f:
            json.dump(self.seen, f)

    def configure_optimizers(self):
        """Return SGD."""
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    """Run the mode on the given number of CPU devices."""
    plan, devices, mode, ckpt, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    # the stop: a checkpoint after optimizer step 3, in the middle of the epoch (where a preempted job resumes)
    saver = ModelCheckpoint(dirpath=Path(ckpt).parent, filename=Path(ckpt).stem, every_n_train_steps=3,
                            save_top_k=-1, enable_version_counter=False)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                        max_steps=3 if mode == "stop" else -1, max_epochs=1, accumulate_grad_batches=ACCUM,
                        logger=False, callbacks=[saver] if mode == "stop" else None,
                        enable_checkpointing=mode == "stop", enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    dm = PlanDataModule(plan, pad_collate(tokenize=utf8), columns=["text"], order="shuffle", seed=3)
    trainer.fit(Counting(out), datamodule=dm, ckpt_path=ckpt if mode == "resume" else None)


if __name__ == "__main__":
    main()
