"""Step trace: which samples each rank trains on at a step, and at which steps a sample comes.

The answers ``sortpack inspect PLAN --step S`` / ``--sample ID`` print, computed with the
sampler's own epoch plan (``EpochPlan``) and step layout (``step_positions``), so they are
what ``PackedSampler`` yields for the same W, A, order, seed and flags. Steps are in the
run's numbering (``epoch * steps_per_epoch + step``, as ``skip_steps`` takes them). A
sample is found by one vectorised pass over the plan; no Python loop over micro-batches.
"""
from __future__ import annotations

from dataclasses import asdict

import numpy as np

from ..errors import SortpackError
from ..permutation import check_seed
from .index import PackedIndex
from .plan import EpochPlan, StepOrder, check_group_alignment, steps_moved
from .sampler_state import Layout

# the most micro-batches one step may hold (W * A): a trace holds arrays of an epoch's steps
MAX_STEP_MICROBATCHES = 1 << 26
_INT64 = (-(1 << 63), 1 << 63)
ONE_RANK, IN_ORDER = Layout(1, 1), StepOrder()


def _plan(index: PackedIndex, layout: Layout, how: StepOrder, epoch: int) -> EpochPlan:
    world_size, grad_accum = layout
    if world_size < 1:
        raise SortpackError(f"--world-size {world_size}: must be >= 1")
    if grad_accum < 1:
        raise SortpackError(f"--grad-accum {grad_accum}: must be >= 1")
    if epoch < 0:
        raise SortpackError(f"--epoch {epoch}: must be >= 0")
    check_seed(how.seed, "--seed", SortpackError)  # the rule of `run --seed`: a seed is a 64-bit key
    if world_size * grad_accum > MAX_STEP_MICROBATCHES:
        raise SortpackError(f"--world-size {world_size} --grad-accum {grad_accum}: {world_size * grad_accum} "
                            f"micro-batches per step, more than inspect traces ({MAX_STEP_MICROBATCHES})")
    moved = steps_moved(index, how.order, how.largest_first, how.warmup_shapes)
    if moved:
        flags = {"largest_first": "--largest-first", "warmup_shapes": "--warmup-shapes"}
        flag = flags.get(moved[0], f"--order {how.order}")
        raise SortpackError(f"{index.path} is a mixture plan: its order is the schedule, and the sampler refuses "
                            f"{moved[0]} (it would break the blend), so {flag} traces steps no run trains on; "
                            "trace it in --order index (docs/mixtures.md)")
    try:
        check_group_alignment(index.options, world_size * grad_accum)
    except ValueError as exc:
        raise SortpackError(str(exc)) from None
    plan = how.epoch_plan(index, world_size, grad_accum, epoch)
    if plan.num_blocks == 0:
        raise SortpackError(f"{index.path}: no steps at --world-size {world_size} --grad-accum {grad_accum}"
                            + (" with --drop-last" if how.drop_last else ""))
    return plan


def _settings(layout: Layout, how: StepOrder, spe: int) -> dict:
    return {"world_size": layout.world_size, "grad_accum": layout.grad_accum, **asdict(how), "steps_per_epoch": spe}


def step_trace(path, step: int, layout: Layout = ONE_RANK, how: StepOrder = IN_ORDER, epoch: int | None = None) -> dict:
    """Return every rank's micro-batches of one step with their sample ids, as a JSON-ready dict.

    ``step`` is a run step (``epoch * steps_per_epoch + step``), or a step of epoch ``epoch``
    when that is given; ``layout`` the sampler's (W, A), ``how`` its order of steps.
    """
    index = path if isinstance(path, PackedIndex) else PackedIndex(path)
    world_size, grad_accum = layout
    spe = _plan(index, layout, how, epoch or 0).num_blocks
    if step < 0:
        raise SortpackError(f"--step {step}: must be >= 0")
    if epoch is None:
        epoch, in_epoch = divmod(step, spe)
    elif step >= spe:
        raise SortpackError(f"--step {step}: epoch {epoch} has {spe} steps (0..{spe - 1}) at --world-size "
                            f"{world_size} --grad-accum {grad_accum}")
    else:
        in_epoch = step
    plan = _plan(index, layout, how, epoch)
    g = world_size * grad_accum
    flat = in_epoch * g + np.arange(g, dtype=np.int64)
    packed = plan.packed_array(flat % plan.length)
    repeat = plan.repeated(flat)
    cols = {c: index.take(c, packed) for c in ("num_samples", "tokens", "batch_size", "padded_size")}
    ranks = []
    for r in range(world_size):
        mbs = []
        for a in range(grad_accum):
            k = a * world_size + r
            mb = int(packed[k])
            mbs.append({"accum": a, "microbatch": mb, "repeat": bool(repeat[k]),
                        "num_samples": int(cols["num_samples"][k]), "tokens": int(cols["tokens"][k]),
                        "shape": [int(cols["batch_size"][k]), int(cols["padded_size"][k])],
                        "sample_ids": index.microbatch(mb).tolist()})
        ranks.append({"rank": r, "microbatches": mbs})
    return {"directory": str(index.path), "run_step": epoch * spe + in_epoch, "epoch": epoch, "step": in_epoch,
            **_settings(layout, how, spe),
            "step_samples": int(cols["num_samples"].sum()), "step_tokens": int(cols["tokens"].sum()),
            "ranks": ranks}


def sample_trace(path, sample_ids, layout: Layout = ONE_RANK, how: StepOrder = IN_ORDER, epoch: int = 0) -> dict:
    """Return, for each sample id, its micro-batch(es) and every step and rank of epoch ``epoch`` that trains on it."""
    index = path if isinstance(path, PackedIndex) else PackedIndex(path)
    world_size, grad_accum = layout
    plan = _plan(index, layout, how, epoch)
    asked = [int(i) for i in sample_ids]
    # an id no int64 holds names no sample either: the same line as any id not in the plan
    missing = [i for i in asked if not _INT64[0] <= i < _INT64[1]]
    want = np.asarray([i for i in asked if _INT64[0] <= i < _INT64[1]], dtype=np.int64)
    mbs, places, found = index.find_samples(want)
    missing += np.setdiff1d(want, found).tolist()
    if missing:
        absent = next(i for i in asked if i in set(missing))
        raise SortpackError(f"--sample {absent}: not in the plan {index.path} "
                            f"({index.num_samples} samples in {index.num_microbatches} micro-batches)")
    g = world_size * grad_accum
    spe = plan.num_blocks
    # every flat position of the epoch, its micro-batch, and the positions holding a wanted one
    flat = np.arange(plan.length, dtype=np.int64)
    packed = plan.packed_array(flat)
    hit = np.flatnonzero(np.isin(packed, mbs))
    hit_mb = packed[hit]
    repeat = plan.repeated(hit)
    order_of = np.argsort(hit_mb, kind="stable")
    starts = np.searchsorted(hit_mb[order_of], mbs)
    stops = np.searchsorted(hit_mb[order_of], mbs, side="right")
    samples = []
    first: dict[int, int] = {}
    for k, i in enumerate(want.tolist()):
        first.setdefault(i, k)
    for k in sorted(range(len(found)), key=lambda k: first[int(found[k])]):  # as asked, then in plan order
        at = hit[order_of[starts[k]:stops[k]]]
        rep = repeat[order_of[starts[k]:stops[k]]]
        step, off = np.divmod(at, g)
        seen = [{"run_step": int(epoch * spe + s), "epoch": epoch, "step": int(s), "rank": int(o % world_size),
                 "accum": int(o // world_size), "repeat": bool(rp)}
                for s, o, rp in zip(step.tolist(), off.tolist(), rep.tolist())]
        samples.append({"sample_id": int(found[k]), "microbatch": int(mbs[k]), "place": int(places[k]),
                        "steps": seen})
    return {"directory": str(index.path), "epoch": epoch, **_settings(layout, how, spe),
            "samples": samples}


def render_trace(trace: dict) -> str:
    """Return a step or sample trace as human-readable lines."""
    head = (f"W={trace['world_size']} A={trace['grad_accum']} order {trace['order']} seed {trace['seed']}"
            + "".join(f" {k.replace('_', '-')}" for k in ("drop_last", "largest_first", "warmup_shapes") if trace[k])
            + f", {trace['steps_per_epoch']} steps per epoch")
    if "ranks" in trace:
        lines = [f"run step {trace['run_step']} (epoch {trace['epoch']} step {trace['step']}; {head}): "
                 f"{trace['step_samples']} samples, {trace['step_tokens']} tokens"]
        for r in trace["ranks"]:
            for mb in r["microbatches"]:
                b, t = mb["shape"]
                lines.append(f"rank {r['rank']} micro-batch {mb['accum']}: #{mb['microbatch']} {b}x{t} "
                             f"{mb['num_samples']} samples {mb['tokens']} tokens"
                             + (" (repeat)" if mb["repeat"] else "")
                             + "  ids " + " ".join(map(str, mb["sample_ids"])))
        return "\n".join(lines)
    lines = [f"epoch {trace['epoch']} ({head})"]
    for s in trace["samples"]:
        where = "; ".join(f"run step {x['run_step']} (step {x['step']}) rank {x['rank']} micro-batch {x['accum']}"
                          + (" (repeat)" if x["repeat"] else "") for x in s["steps"]) or "no step of this epoch"
        lines.append(f"sample {s['sample_id']}: micro-batch #{s['microbatch']}: {where}")
    return "\n".join(lines)
