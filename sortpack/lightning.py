"""The Lightning door: ``PlanDataModule``, a plan as a ``LightningDataModule`` that resumes at any number of devices.

``train_dataloader`` deals the plan to the Trainer's ranks itself (rank ``trainer.global_rank``
of ``trainer.world_size``, ``trainer.accumulate_grad_batches`` micro-batches per optimizer
step) and returns a ``PlanLoader``-backed iterable, not a ``DataLoader``: Lightning re-wraps
only ``DataLoader`` objects (``_prepare_dataloader`` returns anything else as it is), so no
``DistributedSampler`` is put around the plan, whatever ``use_distributed_sampler`` says.
``state_dict``/``load_state_dict`` carry the sampler's place, so ``Trainer.fit(ckpt_path=...)``
resumes in the middle of an epoch, also on another number of devices. Imports lightning.

This file is named ``lightning.py``: loaded as the top-level module ``lightning`` (the
``sortpack/`` directory itself on ``sys.path``), it hands the import to the real Lightning.
"""
from __future__ import annotations

if __name__ == "lightning":  # loaded as top-level ``lightning`` because sortpack/ is on sys.path
    from shadowing import hand_over  # a sibling, top-level here too

    hand_over(__name__, __file__)
else:
    from typing import Any

    import lightning as L

    from .reader.dataset import SourceDataset
    from .reader.index import PackedIndex
    from .reader.loader import PlanLoader
    from .reader.sampler import PackedSampler
    from .reader.sampler_state import check_sampler_state

    class PlanDataModule(L.LightningDataModule):
        """A plan's training batches for a Lightning ``Trainer``: dealt to its ranks, resumable at any device count.

        Parameters
        ----------
        plan : path or PackedIndex
            The plan (an index ``sortpack run`` wrote).
        collate : callable, optional
            Turns a micro-batch's items into a batch (``pad_collate(...)``, ``varlen_collate(...)``);
            None yields the items (``Samples``).
        dataset : map-style dataset, optional
            Where the items come from (default ``SourceDataset(plan, columns=columns)``).
        columns : list of str, optional
            The columns the default ``SourceDataset`` reads (None: all).
        prefetch : int
            Batches ``PlanLoader``'s thread prepares ahead.
        sampler_options
            ``PackedBatchSampler`` keywords other than rank, world size and accumulation, which
            come from the Trainer: ``order``, ``seed``, ``drop_last``, ``largest_first``,
            ``warmup_shapes``, ``skip_steps``, ``skip_samples``.

        Lightning calls ``set_epoch`` on the loader's ``sampler`` at every epoch (the same
        epoch right after a resume keeps the place), and checkpoints hold ``state_dict()``
        under this class's name; the loader is resumable too (Lightning saves its state,
        the same place, beside it). ``sampler`` is the rank's ``PackedBatchSampler`` once
        ``train_dataloader`` has run: ``VariableBatchSizeLR(optimizer, dm.sampler, ...)``
        scales the LR by it.
        """

        def __init__(self, plan, collate=None, *, dataset=None, columns: list[str] | None = None, prefetch: int = 4,
                     **sampler_options: Any):
            super().__init__()
            taken = {"rank", "world_size", "grad_accum"} & set(sampler_options)
            if taken:
                raise ValueError(f"PlanDataModule: {', '.join(sorted(taken))} come(s) from the Trainer "
                                 "(global_rank, world_size, accumulate_grad_batches), not from a keyword")
            self.index = plan if isinstance(plan, PackedIndex) else PackedIndex(plan)
            self.collate, self.prefetch = collate, prefetch
            self.dataset = dataset if dataset is not None else SourceDataset(self.index.path, columns=columns)
            self.sampler_options = sampler_options
            self.sampler: PackedSampler | None = None
            self._pending: dict | None = None  # a loaded place, applied when the sampler is made

        def setup(self, stage: str) -> None:
            """Make this rank's sampler when fitting (rank, world size and accumulation are the Trainer's by now).

            Lightning calls it before ``configure_optimizers``, so a module's LR schedule can
            take ``trainer.datamodule.sampler``, and before a checkpoint's place is loaded.
            """
            if stage == "fit" and self.sampler is None:
                self.sampler = self._new_sampler()

        def _new_sampler(self) -> PackedSampler:
            """Return the rank's sampler, at the loaded place if one is kept."""
            trainer = self.trainer
            if trainer is None:
                raise RuntimeError("PlanDataModule: attach the module to a Trainer first "
                                   "(trainer.fit(model, datamodule=dm))")
            sampler = PackedSampler(self.index, rank=trainer.global_rank, world_size=trainer.world_size,
                                    grad_accum=trainer.accumulate_grad_batches, **self.sampler_options)
            if self._pending is not None:
                sampler.load_state_dict(self._pending)
                self._pending = None
            return sampler

        def train_dataloader(self) -> _TrainerLoader:
            """Return this rank's batches: the plan dealt to the Trainer's ranks, from the sampler's place."""
            if self.sampler is None:
                self.sampler = self._new_sampler()
            return _TrainerLoader(PlanLoader(self.dataset, self.sampler, self.collate, prefetch=self.prefetch))

        def state_dict(self) -> dict:
            """Return the sampler's place (``{"sampler": ...}``), or the loaded one not yet applied; else {}."""
            if self.sampler is not None:
                return {"sampler": self.sampler.state_dict()}
            return {"sampler": self._pending} if self._pending is not None else {}

        def load_state_dict(self, state_dict: dict) -> None:
            """Keep ``state_dict``'s place (checked against the plan now) for the sampler the next loader makes."""
            if not state_dict:
                return
            place = state_dict.get("sampler") if isinstance(state_dict, dict) else None
            if not isinstance(place, dict) or set(state_dict) != {"sampler"}:
                raise ValueError("PlanDataModule state: expected {'sampler': a PackedSampler state}")
            if place.get("version") != PackedSampler.STATE_VERSION:
                raise ValueError(f"PlanDataModule state: unknown sampler state version {place.get('version')!r}")
            check_sampler_state(place, self.index)  # of this plan (its content hash), in range
            if self.sampler is not None:
                self.sampler.load_state_dict(place)
            else:
                self._pending = place

    class _TrainerLoader:
        """The iterable ``train_dataloader`` returns: ``PlanLoader``'s batches, with the length Lightning counts.

        Lightning counts the batches of an epoch from its start, also after a resume (its
        progress holds the batches trained before the checkpoint), so ``len()`` is the
        micro-batches this rank took before the sampler's place plus those left. ``sampler``
        is where Lightning calls ``set_epoch``; ``state_dict``/``load_state_dict`` make the
        loader resumable in Lightning's eyes (the sampler's place, as the module's).
        """

        def __init__(self, loader: PlanLoader):
            self.loader = loader
            self.sampler = loader.sampler

        def __iter__(self):
            return iter(self.loader)

        def __len__(self) -> int:
            sampler = self.sampler
            return int(sampler.state_dict()["step"]) * sampler.grad_accum + len(sampler)

        def state_dict(self) -> dict:
            return self.sampler.state_dict()

        def load_state_dict(self, state: dict) -> None:
            self.loader.load_state_dict(state)
