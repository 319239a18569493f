"""A sampler's place in the run, and the checks of a resume state loaded from a checkpoint.

The place is ``(epoch, position, step)`` under the ``Layout`` (W, A) that laid the epoch out:
the flat micro-batch position where the next step starts and the steps of the epoch before
it. A loaded state dict is checked field by field, then against the index it is resumed on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .index import PackedIndex
from .plan import ORDERS, EpochPlan
from .state_checks import boolean, check_state, integer, one_of, sequence, text


class Layout(NamedTuple):
    """The data-parallel ranks W and the accumulation A that laid out an epoch's steps."""

    world_size: int
    grad_accum: int


@dataclass(frozen=True)
class Place:
    """Where a pass over an epoch starts: epoch, flat position, steps before it, and the epoch's layout."""

    epoch: int
    position: int
    step: int
    layout: Layout


def check_sampler_state(state: dict, index: PackedIndex) -> None:
    """Raise one ValueError naming the first field of ``state`` that is missing, unknown or out of range.

    Parameters
    ----------
    state : dict
        A ``PackedSampler.state_dict()`` as loaded from a checkpoint.
    index : PackedIndex
        The index the sampler resumes on: the state must be of this index, and its position
        inside the epoch its layout lays out.
    """
    positive = integer(1)
    if isinstance(state, dict) and "position" in state and "step" not in state:
        raise ValueError("sampler state: no 'step' (written by an early sortpack that did not count steps; "
                         "it cannot resume exactly: start its epoch again with set_epoch)")
    check_state("sampler", state, {
        "version": integer(), "epoch": integer(0), "position": integer(0), "step": integer(0),
        "seed": integer(), "order": one_of(*ORDERS), "drop_last": boolean, "largest_first": boolean,
        "warmup_shapes": boolean, "world_size": positive, "grad_accum": positive,
        "layout": sequence(positive, 2), "num_microbatches": integer(0), "content_hash": text,
        "skip_steps": sequence(sequence(integer(0), 2)), "skip_samples": sequence(sequence(integer(0), 2)),
        "regridded": boolean,
    }, optional_keys=("skip_steps", "skip_samples", "regridded"))  # states written before these
    if state["num_microbatches"] != index.num_microbatches or state["content_hash"] != index.content_hash:
        raise ValueError("the sampler state belongs to another index (content hash differs)")
    world, accum = (int(v) for v in state["layout"])
    plan = EpochPlan(index, world, accum, state["order"], int(state["seed"]), int(state["epoch"]),
                     bool(state["drop_last"]), bool(state["largest_first"]), bool(state["warmup_shapes"]))
    position = int(state["position"])
    if position > plan.length:
        raise ValueError(f"sampler state: 'position' is {position}, past the epoch's {plan.length} "
                         f"micro-batches (layout {world}x{accum})")
    if int(state["step"]) > position:
        raise ValueError(f"sampler state: 'step' is {state['step']}, more steps than the {position} "
                         f"micro-batches before 'position'")
    # the resume-position rule (docs/guarantees.md): steps of the layout's width end on its grid, so
    # position is step * W * A, unless a step of the epoch had another width (set_grad_accum, or a
    # resume at another world size), which the state records as 'regridded'
    if state.get("regridded") is False and position != int(state["step"]) * world * accum:
        end = int(state["step"]) * world * accum
        raise ValueError(f"sampler state: 'position' {position} is not on a step boundary: step "
                         f"{state['step']} of {world}x{accum} micro-batches ends at {end} "
                         f"(and the state records no change of grad_accum or world size in the epoch)")
