"""What a sampler hands out of the next steps, read ahead: each micro-batch's facts (``MicrobatchFacts``) and a rank's
parts of the next steps (``StepsAhead``), both computed for many at once in vectorised passes."""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np

from .index import PackedIndex
from .microbatch import StepFacts
from .plan import EpochPlan

__all__ = ["MicrobatchFacts", "StepsAhead", "new_facts"]

new_facts = cast(Callable[[type[StepFacts], tuple], StepFacts], tuple.__new__)  # no NamedTuple checks per step


class MicrobatchFacts:
    """What the sampler hands out of each micro-batch, read for many micro-batches in one vectorised pass.

    ``of(packed)`` gives per micro-batch (sample ids, batch_size, padded_size, row_splits,
    tokens, attention, targets or None, the other measures' sums by name or None, (source name or None, source id
    or -1)).
    """

    def __init__(self, index: PackedIndex):
        self.index = index
        self.names = index.source_names or []
        self.sources = index["source"] if self.names else None
        self.tokens = index["tokens"]  # one read of each column, then a gather per chunk
        sums = index.sum_columns
        self.attention, self.targets = (index[n] if n in sums else None for n in ("attention", "targets"))
        # every other per-micro-batch sum: the measures a MicroBatch hands out by name (size2, each --measure)
        self.measures = [(n, index[n]) for n in sums if n not in ("attention", "targets")]

    def of(self, packed) -> list[tuple]:
        """Return the facts of each micro-batch number in ``packed``."""
        at = np.asarray(packed, dtype=np.int64)
        n = len(at)

        def column(col, default) -> list:
            return [default] * n if col is None else col[at].tolist()

        names = self.names
        sources = [(None, -1)] * n if self.sources is None else [(names[s], s) for s in self.sources[at].tolist()]
        measures: list = [None] * n
        if self.measures:
            keys = [name for name, _ in self.measures]
            measures = [dict(zip(keys, row)) for row in zip(*(col[at].tolist() for _, col in self.measures))]
        return list(zip(*self.index.record_lists(at), self.tokens[at].tolist(), column(self.attention, 0),
                        column(self.targets, None), measures, sources))


class StepsAhead:
    """A rank's parts of the next steps of an epoch (``EpochPlan.step_parts``), computed ``CHUNK`` steps at a time.

    One vectorised pass per chunk instead of a table lookup per step, and per micro-batch
    (``MicrobatchFacts``) instead of a record per micro-batch; a change of width (``set_grad_accum``)
    or a position off the chunk computes a new one, and a step that straddles the epoch's
    end is asked of the plan on its own.
    """

    CHUNK = 256

    def __init__(self, plan: EpochPlan, rank: int, facts: MicrobatchFacts):
        self.plan, self.rank, self.facts = plan, rank, facts
        self._key: tuple = ()
        self._first, self._steps, self._width = 0, 0, 1
        self._parts: tuple = ([], [], [], [])
        self._facts: list = []
        sums = facts.index.sum_columns  # the plan's per-micro-batch sums, where it records them
        self._sums = [name if name in sums else None for name in ("attention", "targets")]
        self._step_sums: list = [None, None]

    def parts(self, pos: int, world: int, accum: int) -> tuple:
        """Return (micro-batch numbers, repeat flags, step samples, step tokens, step attention, step targets or None,
        each micro-batch's facts) of the step at ``pos``."""
        width = world * accum
        i, off = divmod(pos - self._first, width)
        if self._key != (world, accum) or off or not 0 <= i < self._steps:
            plan = self.plan
            self._parts = plan.steps_ahead(pos, world, accum, self.rank, self.CHUNK)
            self._key, self._first, self._width = (world, accum), pos, width
            self._steps, i = len(self._parts[2]), 0
            if not self._steps:  # the step straddles the epoch's end
                got = plan.step_parts(pos, world, accum, self.rank)
                attention, targets = (None if name is None else plan.span_sum(name, pos % plan.length, width)
                                      for name in self._sums)
                return (*got, attention or 0, targets, self.facts.of(got[0]))
            self._facts = self.facts.of(self._parts[0])
            # each step's sums over all ranks: two lookups per step in the epoch's running sums
            starts = pos + np.arange(self._steps, dtype=np.int64) * width
            self._step_sums = [None if name is None else (plan.running(name)[starts + width]
                                                          - plan.running(name)[starts]).tolist()
                               for name in self._sums]
        ids, repeat, samples, tokens = self._parts
        cut = slice(i * accum, (i + 1) * accum)
        attention, targets = self._step_sums
        return (ids[cut], repeat[cut], samples[i], tokens[i], 0 if attention is None else attention[i],
                None if targets is None else targets[i], self._facts[cut])
