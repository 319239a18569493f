"""One rank's sampler over an index: steps of ``W * A`` micro-batches, and its resume state.

The resume state is ``(epoch, position, step)``: where the next pass starts. It moves only
when the training loop reports what it *received* (``consume(batch)``; ``step()`` counts a
whole step), so DataLoader workers that prefetch never move it. A sampler iterated directly,
with no such report, falls back to counting the steps it handed out. The sampler knows
nothing of the LR: each ``MicroBatch`` carries its step's batch size, and
``VariableBatchSizeLR`` reads it (or asks ``step_batch()``).
"""
from __future__ import annotations

import numpy as np

from .index import PackedIndex
from .lr import lr_scale
from .microbatch import MicroBatch, StepFacts, step_place
from .plan import ORDERS, EpochPlan, check_group_alignment, step_positions, steps_moved
from .sampler_state import Layout, Place, check_sampler_state
from .skips import Skips
from .steps_ahead import MicrobatchFacts, StepsAhead, new_facts
from .world import resolve_rank


class PackedSampler:
    """One rank's view of an index: steps of ``world_size * grad_accum`` micro-batches.

    Iterating yields ``MicroBatch`` lists of sample ids, ``grad_accum`` per step; every rank
    gets the same number of steps. Report what the loop received with ``consume(batch)``
    so ``state_dict()`` ignores DataLoader prefetch; it resumes exactly, at the same or
    another world size. Framework-free; it is also ``sortpack.torch.PackedBatchSampler``, a
    ``DataLoader`` ``batch_sampler`` whose ``len()`` is the micro-batches left in the epoch
    (``steps * grad_accum``).

    Parameters
    ----------
    index : PackedIndex or path
        The index (a path is opened).
    rank : int, optional
        This rank, ``0 <= rank < world_size``.
    world_size : int, optional
        Data-parallel ranks W. Left out, both come from ``torch.distributed`` when
        initialised, else from the launcher (torchrun's ``RANK``/``WORLD_SIZE``, mpiexec,
        srun), else 0 of 1; a given value that disagrees with those raises ValueError.
    grad_accum : int
        Micro-batches per rank per optimizer step A (``set_grad_accum`` changes it between steps).
    order : {"index", "shuffle", "curriculum"}
        ``index``: steps as packed; ``shuffle``: whole steps shuffled per epoch with ``seed``;
        ``curriculum``: stages in order, steps shuffled within a stage.
    seed : int
        The shuffle's seed (the same on every rank).
    drop_last : bool
        Drop a short last step instead of filling it with micro-batches from the start.
    largest_first : bool
        Put the costliest step (padded tokens) first, to fail fast on out-of-memory.
    warmup_shapes : bool
        Start each epoch with steps that show every rank every distinct micro-batch shape.
    group : torch.distributed process group, optional
        Take rank and world size from this group (the data-parallel group of a job that
        also shards the model) instead of the whole job.
    check_rank : bool
        Refuse a rank or world size that disagrees with the job's (default). False takes
        them as given: to look at another rank's share.
    skip_steps : iterable, optional
        Run steps not to train on (ints, half-open ``(start, stop)`` pairs, ``range`` objects), in
        the run's numbering ``epoch * steps_per_epoch + step`` (``MicroBatch.run_step``).
    skip_samples : iterable of int or dict, optional
        Sample ids taken out of their micro-batches (a dict maps id to size; see ``Skips``).
        ``step_batch``/``step_tokens`` of a step that loses samples no longer count them.

    Examples
    --------
    Rank 1 of 2 takes every other micro-batch of ``plan/`` (``PackedIndex``'s example):

    >>> from sortpack.reader import PackedSampler
    >>> sampler = PackedSampler("plan/", rank=1, world_size=2)
    >>> len(sampler)
    3
    >>> [list(mb) for mb in sampler]  # sample ids of micro-batches 1, 3 and 5
    [[3, 10, 1], [6, 13], [2, 9]]
    >>> mb = next(iter(sampler))
    >>> mb.microbatch, mb.step, mb.step_batch  # step 0's batch: 5 + 3 samples over both ranks
    (1, 0, 8)
    """

    STATE_VERSION = 1

    def __init__(self, index, rank: int | None = None, world_size: int | None = None, grad_accum: int = 1,
                 order: str = "index", seed: int = 0, drop_last: bool = False,
                 largest_first: bool = False, warmup_shapes: bool = False, *, group=None,
                 check_rank: bool = True, skip_steps=None, skip_samples=None):
        rank, world_size = resolve_rank(rank, world_size, group, check_rank, type(self).__name__)
        self.index = index if isinstance(index, PackedIndex) else PackedIndex(index)
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
        if not (isinstance(world_size, int) and world_size >= 1):
            raise ValueError(f"world_size must be a positive integer, not {world_size!r}")
        if not (isinstance(rank, int) and 0 <= rank < world_size):
            raise ValueError(f"rank must be in [0, {world_size}), not {rank!r}")
        self.rank, self.world_size = rank, world_size
        self.order, self.seed, self.drop_last = order, int(seed), bool(drop_last)
        self.largest_first, self.warmup_shapes = bool(largest_first), bool(warmup_shapes)
        self.grad_accum = self._checked_accum(grad_accum)
        self._check_mixture_order()
        self.epoch = 0
        self._layout = Layout(world_size, self.grad_accum)  # that laid out this epoch
        self._position = 0  # flat position where the next step starts (the resume state)
        self._regridded = False  # a step of this epoch had another width than its layout's: off its grid
        self._step = 0  # steps of this epoch before it
        self._explicit = False  # the loop reports consumption (consume/step): hand-outs do not count
        self._resumed = False  # a loaded state: the next set_epoch of its epoch keeps the place
        self._pass_start = Place(0, 0, 0, self._layout)
        self._plans: dict = {}
        self.skips = Skips(self.index, skip_steps, skip_samples)

    # --- configuration ---------------------------------------------------------------
    def _checked_accum(self, a) -> int:
        if not (isinstance(a, (int, np.integer)) and a >= 1):
            raise ValueError(f"grad_accum must be a positive integer, not {a!r}")
        check_group_alignment(self.index.options, self.world_size * int(a))
        return int(a)

    def _check_mixture_order(self) -> None:
        """Refuse an order that would move a mixture plan's steps: the plan's order is its schedule."""
        moved = steps_moved(self.index, self.order, self.largest_first, self.warmup_shapes)
        if moved:
            raise ValueError(f"{self.index.path} is a mixture plan: its order is the schedule, and {moved[0]} "
                             "would break the blend at every prefix; train in order='index' (docs/mixtures.md)")

    @property
    def width(self) -> int:
        """Return the micro-batches per step over all ranks (world_size * grad_accum)."""
        return self.world_size * self.grad_accum

    @property
    def track_steps(self) -> bool:
        """Return whether only reported consumption (``consume``/``step``) moves the state, not hand-outs."""
        return self._explicit

    @track_steps.setter
    def track_steps(self, on: bool) -> None:
        """Follow reported consumption (True) or hand-outs (False) from the current position."""
        self._explicit = bool(on)

    @property
    def position(self) -> int:
        """Return the epoch's flat micro-batch position where the next step starts."""
        return self._position

    def _plan_of(self, epoch: int, layout: Layout) -> EpochPlan:
        key = (epoch, layout, self.order, self.seed, self.drop_last, self.largest_first, self.warmup_shapes)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 4:  # plans of past epochs and layouts
                self._plans.clear()
            w, a = layout
            plan = self._plans[key] = EpochPlan(self.index, w, a, self.order, self.seed, epoch, self.drop_last,
                                                self.largest_first, self.warmup_shapes)
        return plan

    def plan(self) -> EpochPlan:
        """Return the current epoch's plan (built once per epoch)."""
        return self._plan_of(self.epoch, self._layout)

    def _steps_left(self, plan: EpochPlan, position: int, width: int) -> int:
        left = plan.length - position
        if left <= 0:
            return 0
        return left // width if self.drop_last else -(-left // width)

    def _steps_from(self, position: int, step: int | None = None) -> int:
        plan = self.plan()
        left = self._steps_left(plan, position, self.width)
        if not left or not len(self.skips.ranges):
            return left
        first = self._run_base(plan) + (self._step if step is None else step)
        return left - self.skips.skipped_between(first, first + left)

    def _run_base(self, plan: EpochPlan) -> int:
        """Return the run step of this epoch's step 0 (epoch * steps_per_epoch of the epoch's layout)."""
        return self.epoch * plan.num_blocks

    def _next_kept(self) -> tuple[int, int]:
        """Return (position, step) of the first step at or after the consumed one that is not skipped."""
        base = self._run_base(self.plan())
        step = self.skips.next_kept(base + self._step) - base
        return self._position + (step - self._step) * self.width, step

    @property
    def num_steps(self) -> int:
        """Return the steps left to train in this epoch from ``position`` (skipped steps not counted)."""
        return self._steps_from(self.position)

    @property
    def steps_per_epoch(self) -> int:
        """Return the steps of a whole epoch at the current world size and accumulation."""
        return self._plan_of(self.epoch, Layout(self.world_size, self.grad_accum)).num_blocks

    def __len__(self) -> int:
        """Return the micro-batches this rank yields from ``position`` to the end of the epoch."""
        return self.num_steps * self.grad_accum

    def _set_state(self, epoch: int, position: int, step: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._layout = int(epoch), Layout(self.world_size, self.grad_accum)
            self._regridded = False
        self._position, self._step = int(position), int(step)
        if position > 0 and self._steps_from(position, int(step)) == 0:  # the epoch is over: the next one
            self.epoch, self._layout = self.epoch + 1, Layout(self.world_size, self.grad_accum)
            self._position = self._step = 0
            self._regridded = False

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (right after ``load_state_dict`` of that epoch: keep its place)."""
        if self._resumed and int(epoch) == self.epoch:
            self._resumed = False
            return
        self._resumed = False
        self.epoch, self._layout = int(epoch), Layout(self.world_size, self.grad_accum)
        self._position = self._step = 0
        self._regridded = False

    def set_grad_accum(self, grad_accum: int) -> None:
        """Change the accumulation between steps; the epoch continues from the same position."""
        self.grad_accum = self._checked_accum(grad_accum)
        # the epoch's next steps have another width than its layout: positions leave its step grid
        self._regridded = self._regridded or Layout(self.world_size, self.grad_accum) != self._layout

    # --- progress ---------------------------------------------------------------------
    def consume(self, batch) -> None:
        """Record that the training loop received ``batch`` (a ``MicroBatch``, its ``Samples`` or collate dict).

        The state moves to the end of the batch's step once its last micro-batch (``last``)
        is received, so a ``state_dict()`` taken after k optimizer steps resumes at step k
        however far DataLoader workers ran ahead. From the first call on, hand-outs no
        longer move the state.
        """
        epoch, position, end, step, last = step_place(batch)
        self._explicit, self._resumed = True, False
        if last:
            self._set_state(epoch, end, step + 1)
        elif (epoch, position, step) != (self.epoch, self._position, self._step):
            self._set_state(epoch, position, step)
        # else: a later micro-batch of the step already recorded (no state change)

    def step(self) -> None:
        """Record one completed optimizer step (counting from where the current pass started).

        An alternative to ``consume`` for loops that count their steps; the step that ends
        the epoch moves the state to the next epoch.
        """
        if not self._explicit:
            start = self._pass_start
            self.epoch, self._layout, self._position, self._step = start.epoch, start.layout, start.position, start.step
            self._explicit = True
        self._resumed = False
        position, step = self._next_kept()
        self._set_state(self.epoch, position + self.width, step + 1)

    def step_batch(self, by: str = "samples", position: int | None = None) -> int:
        """Return the samples (or tokens, ``by="tokens"``) of the step at ``position`` over all ranks."""
        if by not in ("samples", "tokens"):
            raise ValueError(f"by must be 'samples' or 'tokens', not {by!r}")
        pos = self._next_kept()[0] if position is None else position
        plan = self.plan()
        if plan.length == 0:
            return 0
        total = plan.span_sum("num_samples" if by == "samples" else "tokens", pos % plan.length, self.width)
        if self.skips.sizes:
            lost = self.skips.lost(plan.packed_array((pos + np.arange(self.width)) % plan.length))
            total -= lost.samples if by == "samples" else lost.tokens
        return total

    def lr_scale(self, ref_batch_size: float, method: str = "linear", by: str = "samples",
                 position: int | None = None) -> float:
        """Return the LR multiplier of the step at ``position`` (identical on every rank)."""
        return lr_scale(self.step_batch(by, position), ref_batch_size, method)

    def _grid(self) -> tuple[EpochPlan, np.ndarray]:
        plan = self.plan()
        flat = step_positions(plan.length, self.world_size, self.grad_accum, self.position, self.drop_last)
        if len(self.skips.ranges):
            run = self._run_base(plan) + self._step + np.arange(len(flat), dtype=np.int64)
            flat = flat[self.skips.kept_mask(run)]
        return plan, flat % max(plan.length, 1)

    def schedule(self) -> np.ndarray:
        """Return this rank's micro-batch numbers for the rest of the epoch, shaped (steps, A)."""
        plan, flat = self._grid()
        return plan.packed_array(flat[:, :, self.rank])

    def step_batches(self, by: str = "samples") -> np.ndarray:
        """Return the step batch (samples or tokens over all ranks) of every step left in the epoch."""
        plan, flat = self._grid()
        col = "num_samples" if by == "samples" else "tokens"
        packed = plan.packed_array(flat.reshape(len(flat), self.width))
        values = self.index.take(col, packed)
        total = values.reshape(len(flat), self.width).sum(axis=1).astype(np.int64)
        if self.skips.sizes:
            lost = self.skips.lost_per_row(packed.reshape(len(flat), self.width))
            total -= lost.samples if by == "samples" else lost.tokens
        return total

    # --- iteration ----------------------------------------------------------------------
    def __iter__(self):
        """Yield this rank's micro-batches (``MicroBatch``) from ``position`` to the end of the epoch."""
        if self.num_steps == 0 and self.position > 0:
            self._set_state(self.epoch + 1, 0, 0)
        self._pass_start = Place(self.epoch, self._position, self._step, self._layout)
        return self._iterate(self.epoch, self._layout, self._position, self._step)

    def _iterate(self, epoch: int, layout: Layout, pos: int, step: int):
        plan = self._plan_of(epoch, layout)
        length = plan.length
        base = epoch * plan.num_blocks  # run step of the epoch's step 0
        skips = self.skips
        ahead = StepsAhead(plan, self.rank, MicrobatchFacts(self.index))
        made = MicroBatch.made
        while True:
            w, a = self.world_size, self.grad_accum  # read per step: set_grad_accum applies at once
            if self._steps_left(plan, pos, w * a) == 0:
                return
            kept = skips.next_kept(base + step) - base
            if kept != step:  # skipped steps: jump over them, as if they had been trained on
                pos, step = pos + (kept - step) * w * a, kept
                if not self._explicit and (self.epoch, self._layout) == (epoch, layout):
                    self._set_state(epoch, pos, step)
                continue
            packed, repeat, batch, tokens, step_attention, step_targets, facts_of = ahead.parts(pos, w, a)
            if skips.sizes:
                lost = skips.lost(plan.packed_array((pos + np.arange(w * a)) % length))
                batch, tokens = batch - lost.samples, tokens - lost.tokens
            start, pos = pos, pos + w * a
            if not self._explicit and (self.epoch, self._layout) == (epoch, layout):
                # without reported consumption the state follows what was handed out
                self._set_state(epoch, pos, step + 1)
            if step_targets is None:  # a plan without targets: every token but each document's first
                step_targets = tokens - batch
            facts = new_facts(StepFacts, (epoch, step, start, pos, base + step, batch, tokens, w, step_attention,
                                          step_targets))
            for k, p in enumerate(packed):
                ids, bs, ps, splits, mb_tokens, mb_attention, mb_targets, measures, (source, source_id) = facts_of[k]
                if skips.sizes:
                    ids, splits = skips.kept(p, ids, splits)
                    mb_tokens -= skips.lost([p]).tokens
                # plain ints and bools throughout (tolist, int sums): made without a conversion
                yield made(ids, (p, bs, ps, splits, facts, k == a - 1, mb_tokens, repeat[k], source, mb_attention,
                                 mb_tokens - len(ids) if mb_targets is None else mb_targets, measures, source_id))
            step += 1

    # --- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Return the resume state: epoch, flat position, step, order, seed, W, A and the epoch layout."""
        return {
            "version": self.STATE_VERSION, "epoch": self.epoch, "position": int(self.position),
            "step": int(self._step),
            "seed": self.seed, "order": self.order, "drop_last": self.drop_last,
            "largest_first": self.largest_first, "warmup_shapes": self.warmup_shapes,
            "world_size": self.world_size, "grad_accum": self.grad_accum,
            "layout": list(self._layout), "num_microbatches": self.index.num_microbatches,
            "content_hash": self.index.content_hash, **self.skips.state(),
            # whether position may be off the layout's step grid (docs/guarantees.md, the resume-position rule)
            "regridded": self._regridded or Layout(self.world_size, self.grad_accum) != self._layout,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; W and rank stay this job's, A and the order come from the state.

        A following ``set_epoch`` of the state's epoch keeps the place (a training loop calls
        it again after resuming).
        """
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION:
            version = state.get("version") if isinstance(state, dict) else state
            raise ValueError(f"unknown sampler state version {version!r}")
        check_sampler_state(state, self.index)
        self.order, self.seed = state["order"], int(state["seed"])
        self.drop_last = bool(state["drop_last"])
        self.largest_first, self.warmup_shapes = bool(state["largest_first"]), bool(state["warmup_shapes"])
        self._check_mixture_order()
        self.grad_accum = self._checked_accum(int(state["grad_accum"]))
        self.epoch = int(state["epoch"])
        world, accum = (int(v) for v in state["layout"])
        self._layout = Layout(world, accum)
        self._position = int(state["position"])
        self._step = int(state["step"])
        self._regridded = bool(state.get("regridded", False))
        self._pass_start = Place(self.epoch, self._position, self._step, self._layout)
        self.skips = self.skips.merged(state)  # a restart's skips join its checkpoint's
        self._resumed = True


# A DataLoader's ``batch_sampler``: the same class, under the name that argument suggests
# (``sortpack.torch`` exports it); one constructor and one docstring, nothing to drift.
PackedBatchSampler = PackedSampler
