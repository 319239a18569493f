"""``PlanNode``: a plan's batches as a ``torchdata.nodes`` node whose state resumes at any world size.

torchdata's nodes (``BaseNode``: ``next``, ``get_state``, ``reset(initial_state)``) are how
torchtitan and others hold their data. A node over a ``DistributedSampler`` keeps a count of
items yielded, which means nothing at another world size. ``PlanNode`` keeps the
``PackedSampler``'s place instead (epoch, the flat micro-batch position of the next step,
steps before it): a state taken at W ranks resets nodes at W' ranks and the epoch goes on
with every micro-batch exactly once. The batches are ``PlanLoader``'s (fetched and collated
ahead in its thread), so the node costs what the loader costs. Imports torchdata (and torch).
"""
from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from .reader.loader import PlanLoader
from .reader.microbatch import MicroBatch
from .reader.sampler import PackedSampler
from .reader.sampler_state import check_sampler_state
from .reader.state_checks import check_state, integer


class _MicroBatches:
    """The "dataset" of a node without one: each micro-batch is its own item."""

    def __getitems__(self, mb: MicroBatch) -> MicroBatch:
        return mb


class _Counted:
    """A sampler as ``PlanLoader`` sees it, counting the micro-batches received since the last step ended.

    ``skip`` micro-batches at the start of the next pass are received here and not handed on
    (a state taken in the middle of a step, resumed at the same world size).
    """

    def __init__(self, sampler: PackedSampler):
        self.sampler = sampler
        self.within = 0  # micro-batches of the current step received (0: at a step boundary)
        self.skip = 0

    track_steps = property(lambda self: self.sampler.track_steps,
                           lambda self, on: setattr(self.sampler, "track_steps", on))

    def consume(self, mb: MicroBatch) -> None:
        """Report ``mb`` received to the sampler; count it within its step."""
        self.sampler.consume(mb)
        self.within = 0 if mb.last else self.within + 1

    def __iter__(self):
        """Yield the sampler's micro-batches, the first ``skip`` of them received here."""
        it = iter(self.sampler)
        skip, self.skip = self.skip, 0
        for _ in range(skip):
            self.consume(next(it))
        return it

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.within = 0

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
        self.within = 0


class PlanNode(BaseNode):
    """A ``torchdata.nodes.BaseNode`` of a rank's batches: what ``PlanLoader`` yields, resumable at any world size.

    Parameters
    ----------
    sampler : PackedSampler
        The rank's sampler (``PackedBatchSampler``): its world size, accumulation and order.
    dataset : map-style dataset, optional
        ``SourceDataset`` or any dataset ``PlanLoader`` takes; None yields each ``MicroBatch``
        itself (to a ``collate`` if given).
    collate : callable, optional
        Turns the fetched items into a batch (``pad_collate(...)``, ``varlen_collate(...)``).
    prefetch : int
        Batches ``PlanLoader``'s thread prepares ahead.

    ``get_state()`` is the sampler's ``state_dict()`` and how many micro-batches of the
    current step were yielded (0 after an optimizer step's last micro-batch, where a loop
    checkpoints): a state taken at a step boundary resumes at any world size; one taken inside a
    step resumes at the same world size only (a step's micro-batches are dealt by W). A pass
    that was cut short and started again without a state begins the next epoch, as
    torchdata's ``SamplerWrapper`` does; one that ran to the end goes on with the next epoch.

    Examples
    --------
    Rank 0 of 2 over ``plan/`` (``PackedIndex``'s example), stopped after one step and resumed
    alone (world size 1) from its state:

    >>> from sortpack.torch import PackedBatchSampler, PlanNode
    >>> node = PlanNode(PackedBatchSampler("plan/", rank=0, world_size=2))
    >>> first = next(node)
    >>> list(first), first.last
    ([0, 7, 14, 5, 12], True)
    >>> alone = PlanNode(PackedBatchSampler("plan/", rank=0, world_size=1))
    >>> alone.reset(node.get_state())
    >>> [mb.microbatch for mb in alone]  # micro-batch 1 went to rank 1 in step 0: the rest, once each
    [2, 3, 4, 5]
    """

    STATE_VERSION = 1

    def __init__(self, sampler: PackedSampler, dataset=None, collate=None, *, prefetch: int = 4):
        super().__init__()
        if not isinstance(sampler, PackedSampler):
            raise TypeError(f"PlanNode needs a sortpack PackedSampler (PackedBatchSampler), "
                            f"not {type(sampler).__name__}")
        self.sampler, self.dataset, self.collate = sampler, dataset, collate
        self._counted = _Counted(sampler)
        self._loader = PlanLoader(_MicroBatches() if dataset is None else dataset, self._counted, collate,
                                  prefetch=prefetch)
        self._it: Any = None
        self._started = False

    def reset(self, initial_state: dict | None = None) -> None:
        """Start a pass: from ``initial_state`` (a ``get_state()``, of this plan, of any world size) or where it is."""
        super().reset(initial_state)
        self._loader.close()
        if initial_state is not None:
            self._load(initial_state)
        elif self._started and self.sampler.position > 0:  # a pass cut short: the next epoch
            self._counted.set_epoch(self.sampler.epoch + 1)
        self._it = iter(self._loader)
        self._started = False

    def _load(self, state: dict) -> None:
        """Put the sampler where ``state`` says, ready to skip the micro-batches of its step already yielded.

        Every check comes before anything changes: a refused state leaves the node where it was.
        """
        check_state("PlanNode", state, {"version": integer(self.STATE_VERSION, self.STATE_VERSION),
                                        "sampler": _is_dict, "within_step": integer(0)})
        saved, within = state["sampler"], int(state["within_step"])
        if saved.get("version") != self.sampler.STATE_VERSION:
            raise ValueError(f"PlanNode state: unknown sampler state version {saved.get('version')!r}")
        check_sampler_state(saved, self.sampler.index)  # of this plan, in range
        if within and saved["world_size"] != self.sampler.world_size:
            raise ValueError(f"PlanNode state: taken inside a step ({within} of its micro-batches yielded) at world "
                             f"size {saved['world_size']}; it resumes at that world size only, not "
                             f"{self.sampler.world_size} (take states after an optimizer step)")
        if within >= int(saved["grad_accum"]):
            raise ValueError(f"PlanNode state: 'within_step' is {within}, but a step has {saved['grad_accum']} "
                             "micro-batches per rank")
        self._counted.load_state_dict(saved)
        self._counted.skip = within

    def next(self):
        """Return the next batch (``StopIteration`` at the end of the epoch)."""
        batch = next(self._it)
        self._started = True
        return batch

    def get_state(self) -> dict:
        """Return the state after the batches yielded: the sampler's place and the step's micro-batches yielded."""
        return {"version": self.STATE_VERSION, "sampler": self.sampler.state_dict(),
                "within_step": self._counted.within}


def _is_dict(value) -> str | None:
    """Return why ``value`` is not a sampler state dict (None: it is one)."""
    return None if isinstance(value, dict) else "a dict (a PackedSampler state)"
