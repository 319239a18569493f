"""The torch scheduler wrapper that rescales the LR every step by the step's batch size.

torch is imported only when a ``VariableBatchSizeLR`` is built. The wrapper does not drive
the sampler: it reads the step batch the ``MicroBatch`` carries (``follow``) or asks the
sampler for the step at its consumed position (``step``/``refresh``). The multiplier itself
is the reader's ``lr_scale`` (``sortpack.reader.lr``).
"""
from __future__ import annotations

from ..reader.lr import LR_METHODS, lr_scale
from ..reader.microbatch import step_info


class VariableBatchSizeLR:
    """Rescales the LR every step by the step's batch: base schedule LR x ``scale(batch / ref)``.

    Call ``step()`` once per optimizer step, after ``optimizer.step()``: it steps the base
    schedule and sets every param group's LR for the next step, the step that starts at the
    sampler's position (what the loop ``consume``-d so far). The scale is the same on every
    rank. After changing the sampler outside the loop (``set_epoch``, ``set_grad_accum``,
    ``load_state_dict``) call ``refresh()``; or call ``follow(batch)`` on each batch to take
    the scale from the step the batch carries.

    Parameters
    ----------
    scheduler : torch LR scheduler or torch.optim.Optimizer
        The base schedule (a bare optimizer: its LRs are the base).
    sampler : PackedSampler, optional
        The sampler whose next step ``step()``/``refresh()`` scale for (None: only ``follow``).
    ref_batch_size : float
        The batch (samples, or tokens with ``by="tokens"``) at which the base LR applies.
    method : {"linear", "sqrt", "none"}
        Scale ``k``, ``sqrt(k)`` or 1 with ``k = step batch / ref_batch_size``.
    by : {"samples", "tokens"}
        What a step's batch counts.

    Examples
    --------
    Base LR 1e-3 at 2 samples per step, over ``plan/`` (``PackedIndex``'s example) at rank 0 of 2,
    whose steps hold 8, 4 and 4 samples:

    >>> import torch
    >>> from sortpack.torch import PackedBatchSampler, VariableBatchSizeLR
    >>> sampler = PackedBatchSampler("plan/", rank=0, world_size=2)
    >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    >>> lr = VariableBatchSizeLR(optimizer, sampler, ref_batch_size=2)
    >>> lr.get_last_lr()  # step 0: 8 samples, 4x the reference
    [0.004]
    >>> for batch in sampler:
    ...     sampler.consume(batch)  # what the loop received (PlanLoader reports it itself)
    ...     optimizer.step()
    ...     lr.step()  # the next step's LR
    ...     print(batch.step, lr.get_last_lr())
    0 [0.002]
    1 [0.002]
    2 [0.004]
    """

    def __init__(self, scheduler, sampler=None, ref_batch_size: float = 1.0, method: str = "linear",
                 by: str = "samples"):
        import torch

        if method not in LR_METHODS:
            raise ValueError(f"method must be one of {', '.join(LR_METHODS)}, not {method!r}")
        if by not in ("samples", "tokens"):
            raise ValueError(f"by must be 'samples' or 'tokens', not {by!r}")
        if isinstance(scheduler, torch.optim.Optimizer):
            self.scheduler, self.optimizer = None, scheduler
        else:
            self.scheduler, self.optimizer = scheduler, scheduler.optimizer
        self.sampler = sampler
        self.ref_batch_size, self.method, self.by = float(ref_batch_size), method, by
        # the unscaled LRs of the base schedule; the groups hold these times the scale
        self.base_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.scale = 1.0
        self._last_lr: list[float] = []
        self.refresh()

    def _apply(self) -> None:
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * self.scale
        self._last_lr = [float(g["lr"]) for g in self.optimizer.param_groups]

    def refresh(self) -> None:
        """Set the LR of the sampler's next step (after ``set_grad_accum``, ``set_epoch``, a resume)."""
        if self.sampler is not None and self.sampler.num_steps > 0:
            self.scale = self.sampler.lr_scale(self.ref_batch_size, self.method, self.by)
        self._apply()

    def follow(self, batch) -> None:
        """Set the LR of the step ``batch`` belongs to (a ``MicroBatch``, its ``Samples`` or collate dict)."""
        info = step_info(batch)
        value = info["step_batch"] if self.by == "samples" else info["step_tokens"]
        self.scale = lr_scale(value, self.ref_batch_size, self.method)
        self._apply()

    def step(self, *args, **kwargs) -> None:
        """Advance the base schedule by one step and set the next step's LR."""
        if self.scheduler is not None:
            # hand the base schedule its own LRs: recursive schedules (ExponentialLR,
            # ReduceLROnPlateau) multiply what the groups hold
            for group, base in zip(self.optimizer.param_groups, self.base_lrs):
                group["lr"] = base
            self.scheduler.step(*args, **kwargs)
            self.base_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.refresh()

    def get_last_lr(self) -> list[float]:
        """Return the LR of every param group for the coming step (scaled)."""
        return list(self._last_lr)

    def state_dict(self) -> dict:
        """Return the base schedule's state, the unscaled LRs and the scaling settings."""
        return {"scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
                "base_lrs": list(self.base_lrs), "scale": self.scale, "ref_batch_size": self.ref_batch_size,
                "method": self.method, "by": self.by}

    def load_state_dict(self, state: dict) -> None:
        """Restore the state and re-apply the scale of the sampler's current step."""
        from ..reader.state_checks import check_state, one_of, optional, real, sequence

        check_state("VariableBatchSizeLR", state, {
            "scheduler": optional(lambda v: None if isinstance(v, dict) else "a dict"),
            "base_lrs": sequence(real(0.0), len(self.optimizer.param_groups)),
            "scale": real(0.0, lo_open=True), "ref_batch_size": real(0.0, lo_open=True),
            "method": one_of(*LR_METHODS), "by": one_of("samples", "tokens"),
        })
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self.scale = float(state["scale"])
        self.ref_batch_size = float(state["ref_batch_size"])
        self.method, self.by = state["method"], state["by"]
        self.refresh()
