"""A mixture's plan: the packed units blended into the plan order, moved to the ranks that write them, recorded.

``blend_units`` orders every source's units (``blend.plan_blend``); ``move_to_writers`` moves
each plan micro-batch from the rank that packed it to the rank that writes its index shard
(one Alltoallv; ``move_plan`` and ``plan_order`` are its pure halves); ``mixture_record`` is
the manifest's ``mixture`` object; ``blend_mixture`` does the three.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...inputs.mixture import Mixture
from ...inputs.schedule import deviations
from ...parallel import Comm
from ...partition import balanced_blocks, index_shard_layout
from ..pack import Microbatches, microbatch_stats
from .blend import Blend, plan_blend
from .packing import MixturePacking, PackedUnits, take_runs

__all__ = ["Blended", "IndexShards", "blend_mixture", "blend_units", "mixture_record", "move_plan",
           "move_to_writers", "plan_order", "split_source"]


@dataclass(frozen=True)
class IndexShards:
    """Where the index's shards are cut: at most ``rows`` micro-batches, a new one from ``samples`` samples."""

    rows: int
    samples: int


@dataclass(frozen=True)
class Blended:
    """The blend, the packed units it orders, and each plan micro-batch's packed number ``g``."""

    blend: Blend
    packed: PackedUnits
    g: np.ndarray


def split_source(mbs: Microbatches, stages: int) -> Microbatches:
    """Return ``mbs`` with its ``source`` and ``stage`` columns split from the sort's code (source * stages + stage)."""
    code = mbs.columns["stage"].astype(np.int64)
    mbs.columns["source"] = (code // stages).astype(np.int16)
    mbs.columns["stage"] = (code % stages).astype(np.int16)
    return mbs


def blend_units(packed: PackedUnits, mix: Mixture, group: int) -> Blended:
    """Return the blend of the packed units and each plan micro-batch's packed number."""
    k = len(mix.sources)
    tokens, stages, samples, parts, tables = [], [], [], [], []
    for s in range(k):
        whole, part = packed.units(s, False, group), packed.units(s, True, group)
        tokens.append(packed.tokens[whole].sum(axis=1))
        stages.append(packed.stage[whole[:, 0]])
        samples.append(packed.samples[whole].sum(axis=1))
        parts.append((packed.tokens[part].sum(axis=1), packed.stage[part[:, 0]], packed.samples[part].sum(axis=1))
                     if len(part) else None)
        tables.append(np.concatenate((whole, part)))
    blend = plan_blend(tokens, stages, mix.schedule, mix.total_tokens, mix.seed, mix.names, samples, parts)
    first = np.concatenate(([0], np.cumsum([len(t) for t in tables])))
    table = np.concatenate(tables)
    g = table[first[blend.source.astype(np.int64)] + blend.unit]
    return Blended(blend, packed, g.reshape(-1))


def move_plan(g: np.ndarray, first: int, m: int, writers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (the plan numbers this rank sends, the rank each goes to, its local micro-batch) (pure).

    Plan micro-batch i is packed micro-batch ``g[i]``; this rank packed ``[first, first + m)``;
    ``writers[r]`` is the first plan micro-batch rank r writes (plus the end). A repeated
    micro-batch is sent once per use.
    """
    sel = np.flatnonzero((g >= first) & (g < first + m))
    dest = np.searchsorted(writers, sel, side="right") - 1
    return sel, dest, g[sel] - first


def plan_order(plan: np.ndarray, cols: dict, ids: np.ndarray, rows: np.ndarray | None,
               ranges: tuple[np.ndarray, ...] | None = None
               ) -> tuple[dict, np.ndarray, np.ndarray | None, tuple[np.ndarray, ...] | None]:
    """Return received micro-batches (columns, sample ids, row sizes, piece ranges) sorted by their plan number
    ``plan`` (pure). ``ranges`` (``--oversize split``: begin, end) are parallel to ``ids``."""
    if len(plan) < 2 or bool(np.all(plan[1:] > plan[:-1])):
        return cols, ids, rows, ranges  # one sender (P=1): already in plan order
    order = np.argsort(plan, kind="stable")
    ns = cols["num_samples"].astype(np.int64)
    at = np.concatenate(([0], np.cumsum(ns)))[:-1]
    ids = take_runs(ids, at[order], ns[order])
    if ranges is not None:
        ranges = tuple(take_runs(r, at[order], ns[order]) for r in ranges)
    if rows is not None:
        nrows = cols["batch_size"].astype(np.int64)
        rat = np.concatenate(([0], np.cumsum(nrows)))[:-1]
        rows = take_runs(rows, rat[order], nrows[order])
    return {name: col[order] for name, col in cols.items()}, ids, rows, ranges


def move_to_writers(comm: Comm, mbs: Microbatches, packed: PackedUnits, g: np.ndarray, shards: IndexShards
                    ) -> tuple[int, dict, np.ndarray, np.ndarray | None, tuple[np.ndarray, ...] | None]:
    """Return this rank's block of plan micro-batches: (first, columns, sample ids, row sizes or None, piece
    ranges (begin, end) or None).

    Plan micro-batch i is packed micro-batch ``g[i]``; each rank gets the block of the plan
    whose index shards it writes (``write_index`` then moves nothing). One Alltoallv of the
    per-micro-batch columns and one of the sample ids (with ``--oversize split``: one more per
    piece range, moved as the ids are).
    """
    ns = packed.samples[g]
    lo = balanced_blocks(ns.astype(np.float64) + 1.0, comm.size)
    # the shard layout depends on the plan's sample counts only, not on how they are dealt
    r = comm.rank
    _, lo = index_shard_layout(comm, ns[lo[r]:lo[r + 1]], int(lo[r]), len(g), shards.rows, shards.samples)
    sel, dest, loc = move_plan(g, int(packed.firsts[r]), len(mbs.offsets) - 1, lo)
    per_mb = {name: col[loc] for name, col in mbs.columns.items()}
    per_mb["plan"] = sel
    got = comm.alltoallv_many(per_mb, np.bincount(dest, minlength=comm.size))
    lens = mbs.columns["num_samples"].astype(np.int64)[loc]
    id_counts = np.bincount(dest, weights=lens, minlength=comm.size).astype(np.int64)
    ids = comm.alltoallv(take_runs(mbs.sample_ids, mbs.offsets[:-1][loc], lens), id_counts)
    ranges = None
    if mbs.begin is not None and mbs.end is not None:
        ranges = tuple(comm.alltoallv(take_runs(r, mbs.offsets[:-1][loc], lens), id_counts)
                       for r in (mbs.begin, mbs.end))
    rows = None
    if mbs.row_sizes is not None:
        nrows = mbs.columns["batch_size"].astype(np.int64)
        row_off = np.concatenate(([0], np.cumsum(nrows)))
        rows = comm.alltoallv(take_runs(mbs.row_sizes, row_off[:-1][loc], nrows[loc]),
                              np.bincount(dest, weights=nrows[loc], minlength=comm.size).astype(np.int64))
    cols, ids, rows, ranges = plan_order(got.pop("plan"), got, ids, rows, ranges)
    return int(lo[r]), cols, ids, rows, ranges


def _fewest_uses(packed: PackedUnits, whole: np.ndarray, part: np.ndarray, uses: np.ndarray) -> int:
    """Return the fewest uses of any sample of a source (its ``whole_passes``).

    A sample is used by its whole packing's micro-batch and, when the part pass chose it, once
    more by the part pass's. Where the used part-pass micro-batches hold every sample of the
    source (a part pass that took them all), each sample has that use too: its one pass is a
    part pass, and counting whole-packing uses alone said 0.
    """
    whole_uses, part_uses = uses[whole], uses[part]
    fewest = int(whole_uses.min()) if len(whole_uses) else 0
    if len(part) and int(part_uses.min()) > 0 and int(packed.samples[part].sum()) == int(packed.samples[whole].sum()):
        fewest += int(part_uses.min())
    return fewest


def _source_record(s: int, blended: Blended, group: int) -> dict:
    """Return what source ``s`` holds and gives in the plan (its part of the ``mixture`` record)."""
    blend, packed, g = blended.blend, blended.packed, blended.g
    src = packed.source[g]
    whole = packed.units(s, False, group).reshape(-1)
    part = packed.units(s, True, group).reshape(-1)
    mine = src == s
    used = g[mine]
    uses = np.bincount(g, minlength=len(packed.tokens))
    whole_uses, part_uses = uses[whole], uses[part]
    held = int(packed.tokens[whole].sum())
    got = int(packed.tokens[g][mine].sum())
    padded = int(packed.padded[used].sum())
    samples_held = int(packed.samples[whole].sum())
    if whole_uses.min() > 0:
        unique = samples_held
    else:  # no whole pass completed: the part pass, after them, gave nothing, or it is the only pass
        unique = int(packed.samples[whole][whole_uses > 0].sum()) + int(packed.samples[part][part_uses > 0].sum())
    passes = np.repeat(blend.passes, group)
    # fine-tuning data: the loss targets the source holds and gives (recorded only for such plans)
    targets = {} if packed.targets is None else {"targets_held": int(packed.targets[whole].sum()),
                                                 "targets": int(packed.targets[g][mine].sum())}
    return {
        **targets,
        "tokens_held": held, "samples_held": samples_held, "microbatches_held": len(whole),
        "tokens": got, "samples": int(packed.samples[used].sum()), "microbatches": int(mine.sum()),
        "unique_samples": unique,
        "passes": got / held, "whole_passes": _fewest_uses(packed, whole, part, uses),
        "most_uses": int(whole_uses.max()) + int(part_uses.sum() > 0),
        "pass_count": int(passes[mine].max()) + 1 if mine.any() else 0,
        "part_pass": {"samples": int(packed.samples[part].sum()), "tokens": int(packed.tokens[part].sum()),
                      "microbatches": len(part)},
        "padding_ratio": (1.0 - got / padded) if padded else 0.0,
    }


def mixture_record(how: MixturePacking, blended: Blended) -> dict:
    """Return the manifest's ``mixture`` object: the spec, what each source gives, and the prefix bound."""
    mix, group, blend, packed, g = how.mix, how.group, blended.blend, blended.packed, blended.g
    bases, file_counts = how.sources.bases, how.sources.file_counts
    tokens = packed.tokens[g]
    dev = deviations(tokens, packed.source[g], mix.schedule, blend.total)
    file_first = np.concatenate(([0], np.cumsum(file_counts)))
    sources = []
    for s, spec in enumerate(mix.sources):
        figures = _source_record(s, blended, group)
        sources.append({
            "name": spec.name, "inputs": list(spec.inputs), "column": spec.column, "weight": spec.weight,
            "first_sample": int(bases[s]), "num_rows": int(bases[s + 1] - bases[s]),
            "files": [int(file_first[s]), int(file_counts[s])],
            "share": float(mix.schedule.shares()[s]),
            **figures,
            "max_deviation_tokens": float(dev[s]),
        })
    return {
        **mix.as_dict(),
        "target_tokens": blend.total,
        "tokens": int(tokens.sum()),
        "unit": "microbatch" if group == 1 else f"group of {group} micro-batches",
        "interleave": "wf2q",
        "bound_tokens": int(blend.bound),
        "max_deviation_tokens": float(dev.max()),
        "sources": sources,
    }


# what the packing counted that the plan's stats keep (the rest is recounted from the plan's micro-batches)
_KEPT_STATS = ("oversize", "skipped", "truncated", "skipped_tokens", "truncated_tokens", "auto_shapes", "split",
               "split_pieces", "split_tokens")


def blend_mixture(comm: Comm, mbs: Microbatches, packed: PackedUnits, how: MixturePacking, shards: IndexShards
                  ) -> tuple[Microbatches, dict]:
    """Return (this rank's block of the plan's micro-batches, the manifest's ``mixture`` record). Collective.

    ``mbs`` are this rank's packed micro-batches (whole packing, then part passes) and
    ``packed`` every rank's units; the plan's block is the one this rank writes.
    """
    blended = blend_units(packed, how.mix, how.group)
    g = blended.g
    mbs = split_source(mbs, how.stages)
    start, cols, ids, rows, ranges = move_to_writers(comm, mbs, packed, g, shards)
    record = mixture_record(how, blended)
    info = {key: mbs.stats[key] for key in _KEPT_STATS if key in mbs.stats}
    if mbs.stats.get("empty"):
        # the sources' empty samples that packing dropped (or kept): recorded only when there are
        # some, so the other mixture plans keep their hash
        info.update({key: mbs.stats[key] for key in ("empty", "empty_dropped")})
    begin, end = ranges if ranges is not None else (None, None)
    plan = Microbatches(start, len(g), ids, np.concatenate(([0], np.cumsum(cols["num_samples"], dtype=np.int64))),
                        cols, microbatch_stats(comm, cols, info), rows, begin, end, shapes=mbs.shapes)
    return plan, record
