"""The part pass of a mixture source: which samples give its uses beyond the whole passes.

A source used r times (r = tokens used / tokens held) gives floor(r) whole passes and, for
the rest, a *part pass* over a seeded random subset of its samples (never of its micro-batches:
a micro-batch holds samples of similar length, so choosing whole micro-batches would favour
some lengths). The subset is then packed on its own; it is a subsequence of the sorted order,
so it packs as well as the source does.

Each sample's priority is a 64-bit key: its rank inside its stratum (16 consecutive samples
of the source's sorted order, ranked by a keyed permutation of the stratum) in the top 4 bits,
a keyed hash of its sample id below. The part pass is the samples of smallest key whose
tokens reach the pass's need, so every stratum, hence every length range, gives the same
share of its samples (to one sample per stratum), and which samples of a stratum is seeded.
Keys depend on (seed, source, position in the source's sorted order, sample id) only: the
subset is the same for any rank count. ``part_keys`` is the pure half; ``select_part`` finds
the threshold with a few dozen allreduces of a number per source.

In the job: ``choose_part_passes`` finds each source's need past its whole passes from every
rank's packed units and chooses the samples; ``pack_part_passes`` packs them after the whole
packing, with the lengths it used.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ...distribute import global_start
from ...parallel import Comm
from ...permutation import _M64, _mix, _mix_vec
from ..pack import Microbatches, PackOptions, pack_samples, truncate_length
from ..pack.fits import content_empty, oversize_mask
from ..samples import SampleColumns
from .blend import pass_needs
from .packing import MixturePacking, PackedUnits, concat_microbatches, gather_packed, held_tokens

STRATUM_BITS = 4  # strata of 16 consecutive samples of the sorted order
_HASH_BITS = 64 - STRATUM_BITS
_SALT = 0x70617274  # "part": apart from the blend's pass orders and the reader's shuffles


def _keys(seed: int, source: int) -> tuple[int, int]:
    base = _mix((int(seed) & _M64) ^ _mix(_SALT + int(source)))
    return _mix(base), _mix(base + 1)


def stratum_ranks(position: np.ndarray, seed: int, source: int) -> np.ndarray:
    """Return each sample's rank inside its stratum (uint8, a keyed bijection of the stratum's 16 positions)."""
    pos = np.asarray(position, dtype=np.int64)
    if not len(pos):
        return np.zeros(0, np.uint8)
    stratum_key, _ = _keys(seed, source)
    stratum = pos >> STRATUM_BITS
    first = int(stratum.min())
    with np.errstate(over="ignore"):
        # one hash per stratum, not per sample: its bytes are the round functions of a 4-round
        # Feistel network on the low bits, tabled for the stratum's 16 positions in bytes
        table = _mix_vec(np.arange(first, int(stratum.max()) + 1, dtype=np.int64).astype(np.uint64)
                         ^ np.uint64(stratum_key))
    rounds = table.view(np.uint8).reshape(-1, 8)[:, :4]
    low = np.arange(1 << STRATUM_BITS, dtype=np.uint8)
    left = np.broadcast_to(low >> 2, (len(table), len(low)))
    right = np.broadcast_to(low & 3, (len(table), len(low)))
    for r in range(4):
        f = (rounds[:, r:r + 1] >> (right << 1)) & 3
        left, right = right, left ^ f
    perm = ((left << 2) | right).astype(np.uint8)
    return perm[stratum - first, pos & ((1 << STRATUM_BITS) - 1)]


def jitters(sample_id: np.ndarray, seed: int, source: int) -> np.ndarray:
    """Return each sample's keyed hash (uint64 below 2^60): the order inside its stratum rank."""
    _, id_key = _keys(seed, source)
    with np.errstate(over="ignore"):
        ids = np.asarray(sample_id, dtype=np.int64).astype(np.uint64)
        return _mix_vec(ids ^ np.uint64(id_key)) >> np.uint64(STRATUM_BITS)


def part_keys(position: np.ndarray, sample_id: np.ndarray, seed: int, source: int) -> np.ndarray:
    """Return the part-pass priority (uint64, smaller first) of samples at ``position`` in their source's order."""
    rank = stratum_ranks(position, seed, source).astype(np.uint64)
    return (rank << np.uint64(_HASH_BITS)) | jitters(sample_id, seed, source)


def _hash_thresholds(comm: Comm, sorted_hash: dict[int, np.ndarray], sums: dict[int, np.ndarray],
                     rest: dict[int, float]) -> dict[int, int]:
    """Return, per source, the smallest hash whose samples at the chosen stratum rank reach ``rest[s]`` tokens.

    ``sorted_hash[s]`` are this rank's hashes there in order, ``sums[s]`` their tokens' running
    sums (from 0). A bisection over the hash bits: one allreduce of a number per source each.
    """
    partial = list(rest)
    lo = {s: 0 for s in partial}
    hi = {s: (1 << _HASH_BITS) - 1 for s in partial}  # the whole rank reaches the need
    while any(lo[s] < hi[s] for s in partial):
        mid = {s: (lo[s] + hi[s]) // 2 for s in partial}
        local = np.array([int(sums[s][np.searchsorted(sorted_hash[s], np.uint64(mid[s]), side="right")])
                          for s in partial], dtype=np.int64)
        got = comm.allreduce(local, "sum")
        for i, s in enumerate(partial):
            if lo[s] < hi[s]:
                lo[s], hi[s] = (lo[s], mid[s]) if got[i] >= rest[s] else (mid[s] + 1, hi[s])
    return hi


def select_part(comm: Comm, first_position: list[int], sample_ids: list[np.ndarray], tokens: list[np.ndarray],
                need: np.ndarray, seed: int) -> list[np.ndarray]:
    """Return, per source, which of this rank's samples make its part pass (bool per sample).

    This rank holds of source s the run of its sorted order that starts at position
    ``first_position[s]``: ``sample_ids[s]`` and ``tokens[s]`` (what each adds to a
    micro-batch; 0 where packing drops it: such a sample is never chosen). ``need[s]`` is the
    tokens source s's part pass must reach, below the source's tokens (0: no part pass). The
    part pass is the samples of smallest ``part_keys`` whose tokens reach ``need[s]``: every
    sample of the stratum ranks below the one where the need is reached, and of that rank the
    samples of smallest hash. Collective: one allreduce of the tokens per stratum rank, then
    one per hash bit (a number per source each).
    """
    k = len(need)
    keep = [np.zeros(len(t), dtype=bool) for t in tokens]
    partial = [s for s in range(k) if need[s] > 0]
    if not partial:
        return keep
    levels = 1 << STRATUM_BITS
    ranks = {}
    per_level = np.zeros((len(partial), levels), np.int64)
    for i, s in enumerate(partial):
        t = np.asarray(tokens[s])
        ranks[s] = stratum_ranks(first_position[s] + np.arange(len(t), dtype=np.int64), seed, s)
        ranks[s][t <= 0] = levels - 1  # never chosen: counted nowhere, kept out below
        per_level[i] = np.bincount(ranks[s], weights=t, minlength=levels).astype(np.int64)
    per_level = comm.allreduce(per_level, "sum")
    cum = np.cumsum(per_level, axis=1)
    level = {s: min(int(np.searchsorted(cum[i], need[s], side="left")), levels - 1) for i, s in enumerate(partial)}
    rest = {s: need[s] - (int(cum[i][level[s] - 1]) if level[s] else 0) for i, s in enumerate(partial)}
    at, hashes, sorted_hash, sums = {}, {}, {}, {}
    for s in partial:
        t = np.asarray(tokens[s])
        at[s] = np.flatnonzero((ranks[s] == level[s]) & (t > 0))
        hashes[s] = jitters(np.asarray(sample_ids[s])[at[s]], seed, s)
        order = np.argsort(hashes[s], kind="stable")
        sorted_hash[s] = hashes[s][order]
        sums[s] = np.concatenate(([0], np.cumsum(t[at[s][order]])))
    hi = _hash_thresholds(comm, sorted_hash, sums, rest)
    for s in partial:
        t = np.asarray(tokens[s])
        keep[s] = (ranks[s] < level[s]) & (t > 0)
        keep[s][at[s]] = hashes[s] <= np.uint64(hi[s])
    return keep


def _given_tokens(ordered: SampleColumns, a: int, b: int, popts: PackOptions) -> np.ndarray:
    """Return what packing gives each sample of ``ordered[a:b]``: its size, its cut length, 0 where dropped."""
    size = ordered.size[a:b]
    over = oversize_mask(popts, size, {name: v[a:b] for name, v in ordered.measures.items()})
    if over.any():
        size = size.astype(np.int64)
        size[over] = truncate_length(popts) if popts.oversize == "truncate" else 0
    if ordered.empty_size and not popts.keep_empty and b > a:
        # packing drops a sample of special tokens only: it gives the part pass nothing, so it
        # is never chosen (an empty sample of any other size kind measures 0 already)
        size = np.where(content_empty(ordered, a, b), 0, size)
    return size


def part_pass_samples(comm: Comm, ordered: SampleColumns, popts: PackOptions, part: np.ndarray, held: np.ndarray,
                      seed: int, stages: int) -> SampleColumns | None:
    """Return the part passes' samples in sorted order (None: no source's last pass is a proper subset).

    ``ordered`` is the mixture's sorted union (its stage code is source * ``stages`` + stage, so
    each source is a run of it); ``part`` and ``held`` are each source's last-pass need and
    tokens (``blend.pass_needs``). A sample's tokens are what packing gives it: 0 if dropped
    (empty, ``--oversize skip``), the cut length if truncated. Collective.
    """
    need = np.where(np.asarray(part) < np.asarray(held), np.asarray(part, dtype=np.float64), 0.0)
    if not np.any(need > 0):
        return None
    k = len(need)
    stages = max(1, stages)
    bounds = np.searchsorted(ordered.stage_or_zero(), np.arange(k + 1) * stages, side="left")
    bounds[-1] = len(ordered)
    counts = comm.allreduce(np.diff(bounds).astype(np.int64), "sum")
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    ids, tokens = [], []
    for s in range(k):
        a, b = (int(bounds[s]), int(bounds[s + 1])) if need[s] > 0 else (0, 0)
        ids.append(ordered.sample_id[a:b])
        tokens.append(_given_tokens(ordered, a, b, popts))
    starts = [ordered.start + int(bounds[s]) - int(first[s]) for s in range(k)]
    chosen = select_part(comm, starts, ids, tokens, need, seed)
    keep = np.zeros(len(ordered), dtype=bool)
    for s in range(k):
        if need[s] > 0:
            keep[int(bounds[s]):int(bounds[s + 1])] = chosen[s]
    start, total = global_start(comm, int(keep.sum()))
    return ordered.select(keep, start, total)


def choose_part_passes(comm: Comm, ordered: SampleColumns, mbs: Microbatches, how: MixturePacking
                       ) -> tuple[PackedUnits, SampleColumns | None]:
    """Return (every rank's units of the whole packing ``mbs``, the part passes' samples or None).

    The part passes are the sources' uses past their whole passes: a seeded subset of samples
    of the sorted union ``ordered`` (``part_pass_samples``). Collective.
    """
    mix = how.mix
    packed = gather_packed(comm, mbs, how.stages)
    holds = held_tokens(packed, list(mix.names), how.group)
    needs = pass_needs(holds, mix.schedule, mix.total_tokens)
    return packed, part_pass_samples(comm, ordered, how.popts, needs.part, holds, mix.seed, how.stages)


def pack_part_passes(comm: Comm, chosen: SampleColumns | None, mbs: Microbatches, packed: PackedUnits,
                     how: MixturePacking) -> tuple[Microbatches, PackedUnits]:
    """Return (the whole packing then the part passes' micro-batches, every rank's units of both). Collective.

    The part passes' samples ``chosen`` are packed on their own with the lengths the whole
    packing used (``--shapes auto:K`` chooses them once, from the whole packing).
    """
    if chosen is None:
        return mbs, packed
    popts = dataclasses.replace(how.popts.with_shapes(mbs.shapes), auto_shapes=None)
    part_mbs = pack_samples(comm, chosen, popts, how.key)
    n_part = len(part_mbs.columns["tokens"])
    mbs = concat_microbatches(mbs, part_mbs)
    return mbs, gather_packed(comm, mbs, how.stages, n_part)
