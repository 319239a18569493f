"""``GoodputController``: adapt gradient accumulation to the gradient noise scale during training.

Public as ``sortpack.torch.GoodputController``. The numbers live in ``sortpack.train.goodput``;
this module only measures them with torch hooks, so collecting them costs no extra backward:

- under DDP (W >= 2 ranks) the small batch is one rank's share of the step: a DDP comm hook
  reads each gradient bucket before the all-reduce; the large batch is the all-reduced step;
- in one process the small batch is one micro-batch: a post-accumulate-grad hook on every
  parameter measures how much each backward changed the accumulated gradient (one saved
  copy of the gradients); the large batch is the accumulated step.

Every rank folds the same all-reduced numbers into the same model, and rank 0's choice is
broadcast, so all ranks always run with the same accumulation count.
"""
from __future__ import annotations

import time
import weakref

import numpy as np

from ..reader.microbatch import step_info
from .goodput import NoiseScale, StepTimeModel, adascale_gain, choose_accum

LR_RULES = ("sampler", "adascale")


class GoodputController:
    """Chooses the gradient accumulation count that maximises goodput, between optimizer steps.

    Use ``backward`` in place of ``loss.backward()`` and step the optimizer when it returns
    True::

        ctl = GoodputController(model, sampler, opt, by="tokens", max_accum=8)
        for batch in loader:
            loss = model_loss(batch)           # the micro-batch's mean loss
            if ctl.backward(loss, batch):      # loss / A; under DDP all-reduces on the last only
                opt.step(); opt.zero_grad(); sched.step()

    Parameters
    ----------
    model : torch.nn.Module
        The module being trained; a ``DistributedDataParallel`` module switches to per-rank
        measurements (its comm hook is registered here, so pass it before the first backward).
    sampler : PackedBatchSampler
        The ``PackedBatchSampler`` feeding the loader; its ``set_grad_accum`` is called
        between steps.
    optimizer : torch.optim.Optimizer
        The optimizer (its step hooks measure the step gradient and the step time).
    by : {"samples", "tokens"}
        ``"samples"`` or ``"tokens"``: the unit of batch sizes, as in the LR rule.
    min_accum, max_accum : int
        Bounds of the accumulation count. In one process the measurement needs two
        micro-batches per step, so ``min_accum`` must then be at least 2.
    ref_batch : float, optional
        The reference batch ``M0`` of the efficiency model and of the AdaScale gain
        (default: the first step's batch).
    warmup_steps, interval : int
        Steps before the first decision, and steps between decisions.
    smoothing : float
        Weight of the past in the noise-scale averages.
    lr_rule : {"sampler", "adascale"}
        ``"sampler"`` leaves the LR to ``VariableBatchSizeLR`` (the sampler's linear/sqrt rule
        follows A); ``"adascale"`` multiplies every group's LR during each optimizer step by
        the AdaScale gain ``(M / M0) * E(M)`` (use ``VariableBatchSizeLR(method="none")`` or a
        plain schedule with it).
    clock : callable
        Seconds as a float (``time.perf_counter``); tests pass a fake one.
    """

    def __init__(self, model, sampler, optimizer, *, by: str = "samples", min_accum: int = 1,
                 max_accum: int = 8, ref_batch: float | None = None, warmup_steps: int = 10,
                 interval: int = 5, smoothing: float = 0.95, lr_rule: str = "sampler", clock=time.perf_counter):
        import torch
        import torch.distributed as dist

        if by not in ("samples", "tokens"):
            raise ValueError(f"by must be 'samples' or 'tokens', not {by!r}")
        if lr_rule not in LR_RULES:
            raise ValueError(f"lr_rule must be one of {', '.join(LR_RULES)}, not {lr_rule!r}")
        self.model, self.sampler, self.optimizer = model, sampler, optimizer
        self.by, self.lr_rule, self.clock = by, lr_rule, clock
        self.ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        self.world = dist.get_world_size() if self.ddp else 1
        if not self.ddp and min_accum < 2:
            raise ValueError("in one process the noise scale needs two micro-batches per step: min_accum >= 2")
        if not 1 <= min_accum <= max_accum:
            raise ValueError(f"need 1 <= min_accum <= max_accum, got {min_accum} and {max_accum}")
        self.min_accum, self.max_accum = int(min_accum), int(max_accum)
        self.ref_batch = None if ref_batch is None else float(ref_batch)
        self.warmup_steps, self.interval = int(warmup_steps), max(1, int(interval))
        self.noise = NoiseScale(smoothing)
        self.times = StepTimeModel()
        self.steps = 0
        self.history: list[dict] = []  # one entry per optimizer step: batch, noise scale, A
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._count = 0  # micro-batches of the current step so far
        self._accum = self._sampler_accum()
        self._size = 0.0  # this rank's items in the current step
        self._small_sq = torch.zeros((), dtype=torch.float64)
        self._prev: dict = {}
        self._gain = 1.0
        self._last_tick = None
        self._step_start = None
        self._micro_times: list[float] = []
        self._timed = False
        if sampler.grad_accum < self.min_accum or sampler.grad_accum > self.max_accum:
            sampler.set_grad_accum(min(max(sampler.grad_accum, self.min_accum), self.max_accum))
            self._accum = self._sampler_accum()
        # the hooks hold the controller weakly: a strong hook would close a cycle (controller ->
        # model -> hook -> controller) that only the garbage collector frees, and a DDP model freed
        # that late (at interpreter exit, after destroy_process_group) can abort the process
        if self.ddp:
            model.register_comm_hook(weakref.ref(self), _measure_then_allreduce)
            self._set_sync()
        else:
            self._handles = [p.register_post_accumulate_grad_hook(_weak(self._accumulated)) for p in self._params]
        optimizer.register_step_pre_hook(_weak(self._before_step))
        optimizer.register_step_post_hook(_weak(self._after_step))

    # --- measuring -------------------------------------------------------------------------
    def _sampler_accum(self) -> int:
        return int(self.sampler.grad_accum)

    def _accumulated(self, p) -> None:
        # the change of p.grad in this backward is this micro-batch's gradient over A
        g = p.grad.detach()
        prev = self._prev.get(p)
        if prev is None:
            self._prev[p] = g.clone()
            delta = g.double().pow(2).sum()
        else:
            delta = (g - prev).double().pow(2).sum()
            prev.copy_(g)
        self._small_sq += delta.cpu()

    def _measure_bucket(self, bucket) -> None:
        # before the all-reduce the bucket holds this rank's own accumulated gradient
        self._small_sq += bucket.buffer().detach().double().pow(2).sum().cpu()

    def _size_of(self, batch) -> float:
        if isinstance(batch, (int, float, np.integer, np.floating)):
            return float(batch)
        if isinstance(batch, dict):
            if "cu_seqlens" in batch:
                cu = batch["cu_seqlens"]
                return float(cu[-1]) if self.by == "tokens" else float(len(cu) - 1)
            if "lengths" in batch:
                lengths = batch["lengths"]
                real = batch.get("real")
                if real is not None:
                    lengths = lengths[real]
                return float(lengths.sum()) if self.by == "tokens" else float(len(lengths))
        raise TypeError("backward(loss, batch) needs the collate dict (lengths or cu_seqlens) or a number "
                        f"of {self.by}")

    def backward(self, loss, batch) -> bool:
        """Back-propagate ``loss / A`` for one micro-batch; return True when the step is complete."""
        if self._step_start is None:  # first step after start or resume: no start time, not timed
            self._timed = False
            self._step_start = self._last_tick = self.clock()
        if self._count == 0:
            self._accum = self._step_accum(batch)
        last = self._count + 1 >= self._accum
        (loss / self._accum).backward()
        self._size += self._size_of(batch)
        self._count += 1
        self._set_sync()
        now = self.clock()
        self._micro_times.append(now - self._last_tick)
        self._last_tick = now
        return last

    def _step_accum(self, batch) -> int:
        # the micro-batch knows the step it was planned in, even when DataLoader workers
        # fetched it before the last change of A; a bare number or list falls back to the sampler
        try:
            info = step_info(batch)
        except TypeError:
            return self._sampler_accum()
        return max(1, (int(info["end"]) - int(info["position"])) // int(self.sampler.world_size))

    def _set_sync(self) -> None:
        # DDP decides at forward time whether the backward all-reduces (what no_sync() sets),
        # so the flag for the next micro-batch is set now: all-reduce only on a step's last
        if self.ddp:
            self.model.require_backward_grad_sync = self._count + 1 >= self._accum

    # --- deciding --------------------------------------------------------------------------
    def _all_reduce(self, values: list[float]) -> list[float]:
        import torch

        t = torch.tensor(values, dtype=torch.float64)
        if self.ddp:
            import torch.distributed as dist

            dist.all_reduce(t)
        return t.tolist()

    def _before_step(self, optimizer, args, kwargs) -> None:
        import torch

        big_sq = sum((p.grad.detach().double().pow(2).sum().cpu() for p in self._params if p.grad is not None),
                     torch.zeros((), dtype=torch.float64))
        small_sq, batch = self._all_reduce([float(self._small_sq), self._size])
        if self.ddp:  # mean over ranks of each rank's share; the step is W shares
            small_sq, small_batch = small_sq / self.world, batch / self.world
        else:  # sum over micro-batches of |g_i / A|^2, times A: one micro-batch's |g|^2 on average
            small_sq, small_batch = small_sq * self._accum, batch / self._accum
        self._batch = batch
        if self.ref_batch is None:
            self.ref_batch = batch
        if batch > small_batch > 0:
            self.noise.update(small_sq, small_batch, float(big_sq), batch)
        if self.lr_rule == "adascale" and self.noise.steps:
            self._gain = adascale_gain(self.noise.value, batch, self.ref_batch)
            for group in optimizer.param_groups:
                group["lr"] *= self._gain

    def _after_step(self, optimizer, args, kwargs) -> None:
        if self.lr_rule == "adascale":
            for group in optimizer.param_groups:
                group["lr"] /= self._gain
            self._gain = 1.0
        now = self.clock()
        if self._timed:
            micro = float(np.mean(self._micro_times)) if self._micro_times else None
            self.times.observe(self._accum, now - self._step_start, micro)
        self.steps += 1
        decided = self._accum
        if (self.noise.steps and self.ref_batch is not None and self.steps >= self.warmup_steps
                and self.steps % self.interval == 0):
            decided = choose_accum(self._batch / self._accum, self.noise.value, self.ref_batch, self.times,
                                   (self.min_accum, self.max_accum))
            decided = self._broadcast(decided)
            if decided != self._sampler_accum():
                self.sampler.set_grad_accum(decided)
        self.history.append({"step": self.steps, "batch": self._batch, "noise_scale": self.noise.value,
                             "grad_accum": self._accum})
        for prev in self._prev.values():
            prev.zero_()
        self._small_sq.zero_()
        self._size, self._count, self._micro_times = 0.0, 0, []
        self._accum = self._sampler_accum()
        self._step_start = self._last_tick = self.clock()
        self._timed = True
        self._set_sync()

    def _broadcast(self, value: int) -> int:
        if not self.ddp:
            return int(value)
        import torch
        import torch.distributed as dist

        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.broadcast(t, src=0)
        return int(t.item())

    @property
    def noise_scale(self) -> float:
        """Return the current smoothed gradient noise scale ``B_noise`` (in ``by`` units)."""
        return self.noise.value

    @property
    def grad_accum(self) -> int:
        """Return the accumulation count of the step in progress."""
        return self._accum

    # --- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Return the controller's state: noise-scale and step-time averages, steps, reference batch."""
        return {"noise": self.noise.state_dict(), "times": self.times.state_dict(), "steps": self.steps,
                "ref_batch": self.ref_batch, "grad_accum": self._sampler_accum(),
                "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (load the sampler's own state first)."""
        from ..reader.state_checks import check_state, integer, optional, real

        check_state("GoodputController", state, {
            "noise": lambda v: None if isinstance(v, dict) else "a dict", "times": lambda v: None if isinstance(
                v, dict) else "a dict", "steps": integer(0), "ref_batch": optional(real(0.0, lo_open=True)),
            "grad_accum": integer(1), "history": lambda v: None if isinstance(v, list) else "a list"})
        self.noise.load_state_dict(state["noise"])
        self.times.load_state_dict(state["times"])
        self.steps = int(state["steps"])
        self.ref_batch = None if state["ref_batch"] is None else float(state["ref_batch"])
        self.history = list(state["history"])
        if int(state["grad_accum"]) != self._sampler_accum():
            self.sampler.set_grad_accum(int(state["grad_accum"]))
        self._accum = self._sampler_accum()


def _measure_then_allreduce(controller: weakref.ref, bucket):
    """DDP comm hook: measure the bucket for the live controller; return the default all-reduce future."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ctl = controller()
    if ctl is not None:
        ctl._measure_bucket(bucket)
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default group


def _weak(method):
    """Return a function that calls the bound ``method`` while its object lives (None after)."""
    ref = weakref.WeakMethod(method)

    def call(*args, **kwargs):
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return call
