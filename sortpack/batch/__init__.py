"""Planning as a library call: one in-memory batch of sequence lengths (RL rollouts, an online SFT buffer) packed
into token-capped micro-batches and dealt to W ranks, with the offline plan's pack stage and compiled kernels.

``plan_batch`` (``plan``) returns a ``BatchPlan`` (``result``). No MPI, no files, no torch: a trainer
under torchrun calls it on every rank, or on one and broadcasts the plan. ``adapters`` holds the
signatures trainers call today (verl, slime, TRL). See docs/plan-batch.md.
"""
from __future__ import annotations

from .plan import plan_batch
from .result import BatchPlan

__all__ = ["BatchPlan", "plan_batch"]
