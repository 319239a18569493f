"""The part pass: a seeded, length-stratified subset of samples, so every length range is used r times."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, example, given
from hypothesis import strategies as st

from sortpack.inputs.schedule import Schedule, deviations
from sortpack.parallel import SerialComm
from sortpack.stages.mixture.blend import pass_needs, plan_blend
from sortpack.stages.mixture.part_pass import STRATUM_BITS, part_keys, part_pass_samples, select_part
from sortpack.stages.pack import PackOptions, pack_samples
from sortpack.stages.samples import SampleColumns


def _sorted_sources(sizes: list[np.ndarray]) -> SampleColumns:
    """Return the sources' samples in the mixture's sorted order: by (source, size, id), stage code = source."""
    ids, size, code, base = [], [], [], 0
    for s, sz in enumerate(sizes):
        order = np.lexsort((np.arange(len(sz)), sz))
        ids.append(base + order)
        size.append(sz[order])
        code.append(np.full(len(sz), s, np.int16))
        base += len(sz)
    size_all = np.concatenate(size).astype(np.int64)
    n = len(size_all)
    return SampleColumns(0, n, np.concatenate(ids).astype(np.int64), size_all, size_all, np.concatenate(code), [])


def _units(mbs, source: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Return (each micro-batch's sample ids, tokens, samples) of one source's micro-batches, in pack order."""
    mine = np.flatnonzero(mbs.columns["stage"] == source)
    ids = [mbs.sample_ids[mbs.offsets[i]:mbs.offsets[i + 1]] for i in mine]
    return ids, mbs.columns["tokens"][mine].astype(np.int64), mbs.columns["num_samples"][mine].astype(np.int64)


def plan_two_sources(sizes: list[np.ndarray], weights, total: int, seed: int, budget: int):
    """Return (per-sample uses, the plan's per-unit tokens, sources, the schedule, the blend) of the real stages."""
    comm, popts = SerialComm(), PackOptions(max_tokens=budget, budget="tokens", oversize="truncate")
    ordered = _sorted_sources(sizes)
    whole = pack_samples(comm, ordered, popts)
    schedule = Schedule(np.array([1.0]), np.asarray(weights, dtype=np.float64)[None, :])
    k = len(sizes)
    held = np.array([int(_units(whole, s)[1].sum()) for s in range(k)])
    needs = pass_needs(held, schedule, total)
    chosen = part_pass_samples(comm, ordered, popts, needs.part, held, seed, 1)
    part = pack_samples(comm, chosen, popts) if chosen is not None else None
    tables, tokens, samples, parts = [], [], [], []
    for s in range(k):
        ids, t, n = _units(whole, s)
        tokens.append(t)
        samples.append(n)
        p_ids, p_t, p_n = _units(part, s) if part is not None else ([], np.zeros(0, np.int64), None)
        parts.append((p_t, np.zeros(len(p_t), np.int16), p_n) if len(p_t) else None)
        tables.append(ids + p_ids)
    blend = plan_blend(tokens, [np.zeros(len(t), np.int16) for t in tokens], schedule, total, seed,
                       samples=samples, parts=parts)
    uses = np.zeros(sum(len(x) for x in sizes), np.int64)
    unit_tokens = np.zeros(len(blend), np.int64)
    for i, (s, u) in enumerate(zip(blend.source.tolist(), blend.unit.tolist())):
        ids = tables[s][u]
        uses[ids] += 1
        unit_tokens[i] = int(np.minimum(ordered.size[np.isin(ordered.sample_id, ids)], budget).sum())
    return uses, unit_tokens, schedule, blend
@given(n=st.integers(300, 4000), budget=st.sampled_from([4096, 8192, 16384]), r=st.floats(0.1, 2.9),
       seed=st.integers(0, 2**32), longest=st.sampled_from([512, 2048, 4096]))
@example(n=300, budget=4096, r=0.59375, seed=300, longest=2048)
@example(n=300, budget=4096, r=0.359375, seed=271097, longest=2048)
def test_every_length_quartile_is_used_r_times(n, budget, r, seed, longest):
    rng = np.random.default_rng(seed % 2**16)
    a = np.exp(rng.uniform(np.log(8), np.log(longest), n)).astype(np.int64)  # log-uniform lengths
    assume(a.sum() >= 24 * budget)  # a source of a few dozen micro-batches or more
    b = np.full(400, 100, np.int64)
    total = int(round(r * a.sum() / 0.5))  # a has half the weight: it gives r times what it holds
    uses, unit_tokens, schedule, blend = plan_two_sources([a, b], [0.5, 0.5], total, seed, budget)
    ua = uses[:n]
    got = float((ua * a).sum() / a.sum())
    # every sample floor(r) or ceil(r) times
    assert set(np.unique(ua).tolist()) <= {math.floor(got), math.ceil(got)}, (np.unique(ua), got)
    # every length quartile used as often as the source's samples are on average, to 0.1: quartiles of whole strata (16
    # consecutive samples of the sorted order, STRATUM_BITS), as the subset promises the same share of every stratum's
    # samples; a stratum cut by a quartile's edge may give either side all of its chosen samples (n=300, seed=300: 0.106
    # off with quartiles cut at n/4). The share is of samples, so it is held against the samples' mean use: the
    # token-weighted `got` differs from it by which lengths inside a stratum were chosen (n=300, seed=271097: means
    # 0.35-0.44 around a sample mean of 0.40, `got` 0.33)
    rank = np.lexsort((np.arange(n), a))
    strata = -(-n // 16)
    quartile = np.empty(n, np.int64)
    quartile[rank] = (np.arange(n) // 16) * 4 // strata
    means = [float(ua[quartile == q].mean()) for q in range(4)]
    assert max(abs(m - float(ua.mean())) for m in means) <= 0.1, (means, float(ua.mean()), got, blend.bound)
    # the prefix bound holds with the part passes' units
    assert deviations(unit_tokens, blend.source, schedule, blend.total).max() <= blend.bound + 1e-9 * blend.total


def test_the_subset_reaches_the_need_stratum_by_stratum_and_follows_the_seed():
    """Keys depend on position and id only; the threshold search reaches the need by less than one sample."""
    rng = np.random.default_rng(5)
    tokens = [rng.integers(1, 500, 3000), rng.integers(1, 500, 2000)]
    ids = [rng.permutation(3000), 3000 + rng.permutation(2000)]
    need = np.array([0.3 * tokens[0].sum(), 0.8 * tokens[1].sum()])
    one = select_part(SerialComm(), [0, 0], ids, tokens, need, 7)
    for q, need_s in enumerate(need):
        got = int(tokens[q][one[q]].sum())
        assert got >= need_s and got - need_s < tokens[q].max()
    # each stratum of 16 gives its share of samples, to one sample plus the boundary rank's draw
    counts = np.bincount(np.flatnonzero(one[0]) >> STRATUM_BITS, minlength=3000 >> STRATUM_BITS)
    assert counts.max() - counts.min() <= 6
    # a different seed, a different subset; the keys are a bijection inside each stratum
    assert not np.array_equal(one[0], select_part(SerialComm(), [0, 0], ids, tokens, need, 8)[0])
    top = part_keys(np.arange(64), np.arange(64), 3, 0) >> np.uint64(64 - STRATUM_BITS)
    assert all(sorted(top[i:i + 16].tolist()) == list(range(16)) for i in range(0, 64, 16))
    # a run of the sorted order starting elsewhere (another rank's share) gets the same keys
    assert np.array_equal(part_keys(np.arange(40, 64), np.arange(40, 64), 3, 0),
                          part_keys(np.arange(64), np.arange(64), 3, 0)[40:])


def test_a_part_pass_never_chooses_a_sample_of_special_tokens_only():
    # under --size tokens with [CLS]/[SEP] an empty text measures 2: packing drops it, so choosing
    # it gave the part pass tokens it never held
    from dataclasses import replace

    rng = np.random.default_rng(3)
    sizes = rng.integers(3, 40, size=200)
    sizes[::4] = 2  # a quarter are empty texts
    ordered = replace(_sorted_sources([sizes]), empty_size=2)
    popts = PackOptions(max_tokens=64, budget="tokens")
    content = int(sizes[sizes > 2].sum())
    chosen = part_pass_samples(SerialComm(), ordered, popts, np.array([content // 2]), np.array([content]), 0, 1)
    assert chosen is not None and len(chosen) and int(chosen.size.min()) > 2
    assert int(chosen.size.sum()) >= content // 2  # the need is met with content alone
