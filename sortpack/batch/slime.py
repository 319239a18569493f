"""slime's dynamic batch with its signature, planned by ``plan_batch``: ``build_dp_schedule`` (a rollout's samples
split into training steps, each packed into micro-batches of at most ``max_tokens_per_gpu * cp_size`` tokens, the
same count on every data-parallel rank, dealt by compute).

Drop-in for ``slime.utils.dp_schedule.build_dp_schedule`` on its dynamic path
(``--use-dynamic-batch-size``): the cards of a context-parallel group share one micro-batch of
``cp_size * max_tokens_per_gpu`` tokens; a sample over that cap is a micro-batch of its own, as in
slime. The micro-batches are best fit's rather than first fit's in rollout order, dealt by
Karmarkar-Karp over their compute with equal counts whether or not ``balance_data`` is set, and
``balance_by_flops`` (which in slime lets a micro-batch exceed the cap) keeps the cap here.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import SortpackError
from .options import DEFAULT_COST_COEFF
from .plan import plan_batch


def _cost_coeff(args) -> float:
    """Return C of ``C*s + s^2`` for the model of ``args``: 6 x hidden size (docs/step-costs.md), else the default."""
    hidden = getattr(args, "hidden_size", None)
    return 6.0 * float(hidden) if hidden else DEFAULT_COST_COEFF


def _steps(rollout_indices: list[int], global_batch_size: int) -> list[np.ndarray]:
    """Return the samples of each step: ``global_batch_size`` rollouts a step (in order of first appearance), a
    rollout's samples together in their order; the rollouts of a last partial step wait."""
    rid = np.asarray(rollout_indices)
    _, first, inverse = np.unique(rid, return_index=True, return_inverse=True)
    place = np.empty(len(first), np.int64)
    place[np.argsort(first, kind="stable")] = np.arange(len(first))
    rollout = place[inverse.reshape(-1)]  # each sample's rollout, numbered by first appearance
    steps = len(first) // global_batch_size
    if steps < 1:
        raise SortpackError(f"build_dp_schedule: {len(first)} rollouts < global_batch_size {global_batch_size}")
    order = np.argsort(rollout, kind="stable")
    step = rollout[order] // global_batch_size
    order = order[step < steps]
    return np.split(order, np.searchsorted(step[step < steps], np.arange(1, steps)))


def build_dp_schedule(args, train_parallel_config: dict, total_lengths: list[int], *, global_batch_size: int,
                      rollout_indices: list[int]):
    """Return (partitions, micro_batch_indices, num_microbatches, global_batch_sizes) as slime's ``build_dp_schedule``.

    ``partitions[r]``: the global sample indices rank r trains, step after step;
    ``micro_batch_indices[r]``: its micro-batches as local index lists into ``partitions[r]``;
    ``num_microbatches[s]``: micro-batches per rank in step s; ``global_batch_sizes[s]``: rollouts
    in step s. ``args`` carries ``use_dynamic_batch_size`` (required), ``max_tokens_per_gpu`` and
    optionally ``hidden_size`` (C = 6 x hidden size of the compute balanced); the config carries
    ``dp_size``, ``cp_size``, ``vpp_size`` and ``microbatch_group_size_per_vp_stage``.
    """
    if not getattr(args, "use_dynamic_batch_size", False):
        raise SortpackError("build_dp_schedule: this adapter plans the dynamic batch (use_dynamic_batch_size); "
                            "a fixed micro_batch_size needs no planning")
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, numbers.Integral) \
            or global_batch_size < 1:
        raise SortpackError(f"build_dp_schedule: global_batch_size={global_batch_size!r}: expected an integer >= 1")
    if np.shape(rollout_indices) != np.shape(total_lengths):
        # a shorter list silently dropped the samples past its end, a longer one was numpy's IndexError
        raise SortpackError(f"build_dp_schedule: rollout_indices has shape {np.shape(rollout_indices)}, "
                            f"total_lengths {np.shape(total_lengths)}: expected one rollout index per sample")
    dp = int(train_parallel_config["dp_size"])
    cap = int(args.max_tokens_per_gpu) * int(train_parallel_config.get("cp_size", 1))
    vpp = train_parallel_config.get("vpp_size") or 1
    group = int(train_parallel_config.get("microbatch_group_size_per_vp_stage") or 1) if vpp > 1 else 1
    lengths = np.asarray(total_lengths, dtype=np.int64)
    partitions: list[list[int]] = [[] for _ in range(dp)]
    micro: list[list[list[int]]] = [[] for _ in range(dp)]
    counts, sizes = [], []
    for ids in _steps(list(rollout_indices), int(global_batch_size)):
        plan = plan_batch(lengths[ids], world_size=dp, max_tokens=cap, count_multiple=group,
                          cost_coeff=_cost_coeff(args), oversize="alone")
        counts.append(plan.counts()[0])
        sizes.append(int(global_batch_size))
        for r in range(dp):
            a, b = plan.offsets[plan.firsts[r]], plan.offsets[plan.firsts[r + 1]]
            start = len(partitions[r])
            partitions[r].extend(ids[plan.indices[a:b]].tolist())
            bounds = (plan.offsets[plan.firsts[r]:plan.firsts[r + 1] + 1] - a + start).tolist()
            micro[r].extend(list(range(x, y)) for x, y in zip(bounds[:-1], bounds[1:]))
    return partitions, micro, counts, sizes
