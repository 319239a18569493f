"""sortpack.reader.plan and .permutation: the step layout over ranks, epoch orders, the keyed shuffle."""
from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sortpack.reader import KeyedPermutation, PackedIndex, PackedSampler, lr_scale, step_positions
from sortpack.reader.plan import StepOrder

from reader_fixtures import exact_index, pipeline_index

try:
    from sortpack.report.inspect import step_costs
except ImportError:  # before inspect.py became report.py (a concurrent rename)
    from sortpack.inspect import step_costs


def all_ranks(index, world, accum, **kw):
    return [PackedSampler(index, rank=r, world_size=world, grad_accum=accum, **kw) for r in range(world)]


# --- permutation --------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64, 65, 1000, 4099])
def test_keyed_permutation_is_a_bijection(n):
    perm = KeyedPermutation(n, seed=7, epoch=3)
    images = perm.array(np.arange(n))
    assert sorted(images.tolist()) == list(range(n))
    assert [perm(i) for i in range(min(n, 200))] == images[:200].tolist()
    if n >= 17:
        assert images.tolist() != KeyedPermutation(n, seed=7, epoch=4).array(np.arange(n)).tolist()


# --- the step layout has one home ----------------------------------------------------------------
@pytest.mark.parametrize("m,world,accum", [(23, 2, 3), (5, 4, 2), (64, 1, 1), (7, 3, 1)])
def test_inspect_and_the_sampler_share_the_step_layout(small, m, world, accum):
    cost = np.arange(1, m + 1, dtype=np.int64) * 10
    grid = step_positions(m, world, accum) % m
    assert np.array_equal(step_costs(cost, world, accum), cost[grid].sum(axis=1))
    ix = PackedIndex(small)  # 23 micro-batches: the sampler takes the same positions, rank by rank
    grid = step_positions(23, world, accum) % 23
    for r, s in enumerate(all_ranks(ix, world, accum)):
        assert s.schedule().tolist() == grid[:, :, r].tolist()


# --- the property test ----------------------------------------------------------------------
@given(n=st.integers(1, 8000), layout=st.tuples(st.integers(1, 64), st.integers(1, 4)),
       how=st.builds(StepOrder, order=st.sampled_from(["index", "shuffle"]), seed=st.integers(0, 3),
                     drop_last=st.booleans()),
       data=st.data())
def test_every_rank_gets_equal_steps_and_agrees_on_lr(n, layout, how, data):
    (world, accum), (order, seed, drop_last) = layout, (how.order, how.seed, how.drop_last)
    with tempfile.TemporaryDirectory() as tmp:
        lengths = np.random.default_rng(n).integers(1, 200, size=n)
        ix = PackedIndex(pipeline_index(Path(tmp) / "ix", lengths, max_tokens=800, rows_per_shard=997))
        m = ix.num_microbatches
        samplers = all_ranks(ix, world, accum, order=order, seed=seed, drop_last=drop_last)
        scheds = [s.schedule() for s in samplers]
        steps = {sc.shape[0] for sc in scheds}
        assert len(steps) == 1 and {len(s) for s in samplers} == {steps.pop() * accum}
        n_steps = scheds[0].shape[0]
        g = world * accum
        if drop_last:
            assert n_steps == m // g
        else:
            assert n_steps == max(1, math.ceil(m / g))
        seen = Counter(np.concatenate([sc.ravel() for sc in scheds]).tolist())
        if drop_last:
            assert max(seen.values(), default=1) == 1 and len(seen) == n_steps * g
        else:
            assert set(seen) == set(range(m))
        # every rank computes the same LR per step, and it is the samples the ranks received
        batches = [s.step_batches() for s in samplers]
        assert all(np.array_equal(batches[0], b) for b in batches[1:])
        lrs = [[lr_scale(b, 7, "sqrt") for b in bb] for bb in batches]
        assert all(lr == lrs[0] for lr in lrs)
        per_step = sum(ix["num_samples"][sc].sum(axis=1) for sc in scheds)
        assert np.array_equal(per_step, batches[0])
        # the per-step iterator yields exactly the vectorised schedule (two ranks checked)
        for r in {0, world - 1}:
            fresh = PackedSampler(ix, rank=r, world_size=world, grad_accum=accum, order=order,
                                  seed=seed, drop_last=drop_last)
            got = list(fresh)
            assert [mb.microbatch for mb in got] == scheds[r].ravel().tolist()
            assert [mb.step_batch for mb in got] == np.repeat(batches[0], accum).tolist()
            k = data.draw(st.integers(0, max(len(got) - 1, 0)))
            if got:
                assert list(got[k]) == ix.microbatch(got[k].microbatch).tolist()


def test_interleaving_matches_the_contract(small):
    s = all_ranks(small, 2, 3, order="index")
    # step s takes micro-batches s*W*A + a*W + r
    assert s[0].schedule()[:2].tolist() == [[0, 2, 4], [6, 8, 10]]
    assert s[1].schedule()[:2].tolist() == [[1, 3, 5], [7, 9, 11]]
    # 23 micro-batches, steps of 6: four steps, the last padded from the start
    assert s[1].schedule()[3].tolist() == [19, 21, 0]


def test_fewer_microbatches_than_a_step_still_give_one_full_step(tmp_path):
    path = exact_index(tmp_path / "ix", 3, per=2)
    samplers = all_ranks(path, 4, 2)
    assert [s.schedule().tolist() for s in samplers] == [[[0, 1]], [[1, 2]], [[2, 0]], [[0, 1]]]
    assert all(len(s) == 0 for s in all_ranks(path, 4, 2, drop_last=True))


# --- orders --------------------------------------------------------------------------------------
def test_epochs_shuffle_whole_steps_identically_on_every_rank(tmp_path):
    path = exact_index(tmp_path / "ix", 64, seed=2)
    ranks = all_ranks(path, 4, 1, order="shuffle", seed=5)
    orders = []
    for epoch in range(3):
        per_rank = []
        for s in ranks:
            s.set_epoch(epoch)
            per_rank.append(s.schedule()[:, 0])
        blocks = per_rank[0] // 4
        assert all(np.array_equal(p // 4, blocks) for p in per_rank)  # same step on every rank
        assert all(np.array_equal(p % 4, np.full(len(p), r)) for r, p in enumerate(per_rank))
        assert sorted(blocks.tolist()) == list(range(16))
        orders.append(blocks.tolist())
    assert orders[0] != orders[1] != orders[2]


def test_largest_first_puts_the_costliest_step_first(tmp_path):
    path = exact_index(tmp_path / "ix", 50, seed=4, pad_to_multiple=8)
    ix = PackedIndex(path)
    cost = ix["batch_size"].astype(np.int64) * ix["padded_size"]
    for order in ("index", "shuffle"):
        s = all_ranks(ix, 2, 2, order=order, largest_first=True)
        first = np.concatenate([x.schedule()[0] for x in s])
        assert cost[first].max() == cost.max()
        plain = all_ranks(ix, 2, 2, order=order)
        rest = sorted(np.concatenate([x.schedule()[1:].ravel() for x in s]).tolist())
        everything = np.concatenate([x.schedule().ravel() for x in plain]).tolist()
        assert sorted(everything) == sorted(first.tolist() + rest)


def test_curriculum_walks_stages_in_order_and_shuffles_within(tmp_path):
    path = exact_index(tmp_path / "ix", 60, seed=3, stages=3)
    ix = PackedIndex(path)
    assert len(ix) == 60 and ix["stage"].tolist() == np.repeat([0, 1, 2], 20).tolist()
    epochs = []
    for epoch in range(2):
        s = PackedSampler(ix, world_size=1, grad_accum=2, order="curriculum", seed=1)
        s.set_epoch(epoch)
        sched = s.schedule()
        stages = ix["stage"][sched[:, 0]]
        assert np.all(np.diff(stages) >= 0)
        epochs.append(sched[:, 0].tolist())
    assert epochs[0] != epochs[1] and sorted(epochs[0]) == sorted(epochs[1])
    assert PackedSampler(ix, grad_accum=2).schedule()[:, 0].tolist() == list(range(0, 60, 2))


@pytest.mark.parametrize("uniform", [True, False])
def test_warmup_shapes_show_every_rank_every_shape_first(tmp_path, uniform):
    lengths = np.random.default_rng(8 + uniform).integers(1, 128, size=400)
    if uniform:  # same-shape groups of 4: blocks of W*A = 4 are uniform and get moved
        opts = {"max_tokens": 256, "group_size": 4, "same_shape": True, "shapes": (16, 32, 48, 64, 96, 128)}
    else:
        opts = {"max_tokens": 256, "shapes": (16, 32, 48, 64, 96, 128)}
    ix = PackedIndex(pipeline_index(tmp_path / "ix", lengths, **opts))
    bsz, padded = ix["batch_size"], ix["padded_size"]
    distinct = len(set(zip(bsz.tolist(), padded.tolist())))
    for order in ("index", "shuffle"):
        for world, accum in ((2, 2), (4, 1), (1, 4)):
            ranks = all_ranks(ix, world, accum, order=order, seed=2, warmup_shapes=True)
            plain = all_ranks(ix, world, accum, order=order, seed=2)
            for s in ranks:
                first = s.schedule()[:distinct].ravel()
                shown = set(zip(ix["batch_size"][first].tolist(), ix["padded_size"][first].tolist()))
                assert len(shown) == distinct
            warm = ranks[0].plan()
            head = [warm.block(t) for t in range(warm.num_blocks)]
            moved = [b for b in head[:distinct] if b >= 0]
            base = [plain[0].plan().block(t) for t in range(plain[0].plan().num_blocks)]
            assert [b for b in head if b >= 0 and b not in moved] == [b for b in base if b not in moved]
            if uniform:
                assert warm.num_blocks == plain[0].plan().num_blocks  # nothing repeated
            cost = ix["batch_size"].astype(np.int64) * ix["padded_size"]
            assert [cost[s.schedule()[0]].max() for s in ranks] == [cost.max()] * world  # largest first


def test_same_shape_groups_refuse_misaligned_steps(tmp_path):
    path = exact_index(tmp_path / "ix", 24, per=2, group_size=4, same_shape=True)
    for world, accum in ((4, 1), (2, 2), (8, 1), (4, 3), (2, 1), (1, 1)):
        PackedSampler(path, world_size=world, grad_accum=accum)
    for world, accum in ((3, 1), (6, 1), (2, 3)):
        with pytest.raises(ValueError, match="same-shape groups of 4"):
            PackedSampler(path, world_size=world, grad_accum=accum)
    s = PackedSampler(path, world_size=2, grad_accum=2)
    with pytest.raises(ValueError):
        s.set_grad_accum(3)


@pytest.mark.parametrize("order,kw", [("index", {}), ("shuffle", {}), ("shuffle", {"largest_first": True}),
                                      ("index", {"warmup_shapes": True}), ("shuffle", {"drop_last": True})])
def test_step_parts_read_from_the_flat_table_equal_the_per_position_answers(small, order, kw):
    """The sampler's per-epoch table gives what packed / is_repeat / span_sum give, at every step and width."""
    from sortpack.reader.plan import EpochPlan

    ix = PackedIndex(small)
    for world, accum in [(1, 1), (2, 3), (4, 2), (3, 1)]:
        plan = EpochPlan(ix, world, accum, order, seed=5, epoch=1, **kw)
        width = world * accum
        for w, a in [(world, accum), (world, 1), (1, accum + 1)]:  # set_grad_accum: other widths on the plan
            for pos in range(0, plan.length + 2 * width, w * a):
                for rank in range(w):
                    ids, rep, samples, tokens = plan.step_parts(pos, w, a, rank)
                    mine = [pos + k * w + rank for k in range(a)]
                    assert ids == [plan.packed(f % plan.length) for f in mine]
                    assert rep == [plan.is_repeat(f) for f in mine]
                    assert samples == plan.span_sum("num_samples", pos % plan.length, w * a)
                    assert tokens == plan.span_sum("tokens", pos % plan.length, w * a)
        assert width == plan.width


@pytest.mark.parametrize("order,kw", [("index", {}), ("shuffle", {}), ("shuffle", {"largest_first": True}),
                                      ("index", {"warmup_shapes": True}), ("shuffle", {"drop_last": True})])
def test_span_sums_from_the_running_sums_equal_the_columns_summed_position_by_position(small, order, kw):
    """Once the sampler built a column's running sums, a span's sum is still that column's over its positions."""
    from sortpack.reader.plan import EpochPlan

    ix = PackedIndex(small)
    for world, accum in [(1, 1), (2, 3), (3, 1)]:
        plan = EpochPlan(ix, world, accum, order, seed=5, epoch=1, **kw)
        for name in ("num_samples", "tokens", "attention"):
            plan.running(name)
            for start in range(0, plan.length, 1 + plan.length // 9):
                for count in (1, world * accum, 2 * world * accum + 1, plan.length):
                    flat = (start + np.arange(count)) % plan.length
                    want = int(sum(int(ix.take(name, np.array([plan.packed(int(f))]))[0]) for f in flat))
                    assert plan.span_sum(name, start, count) == want


@pytest.mark.parametrize("order,kw", [("index", {}), ("shuffle", {}), ("shuffle", {"largest_first": True}),
                                      ("index", {"warmup_shapes": True}), ("shuffle", {"drop_last": True})])
def test_steps_ahead_gives_step_parts_a_chunk_at_a_time(small, order, kw):
    """The sampler's vectorised chunks are each step's step_parts, up to one that straddles the end."""
    from sortpack.reader.plan import EpochPlan

    ix = PackedIndex(small)
    for world, accum in [(1, 1), (2, 3), (4, 2), (3, 1)]:
        plan = EpochPlan(ix, world, accum, order, seed=5, epoch=1, **kw)
        for w, a in [(world, accum), (world, 1), (1, accum + 1)]:
            for start in range(0, plan.length + 1, 1 + plan.length // 7):  # also off the step grid
                for rank in range(w):
                    for count in (1, 3, 64):
                        ids, rep, samples, tokens = plan.steps_ahead(start, w, a, rank, count)
                        steps = len(samples)
                        assert steps == max(0, min(count, (plan.length - start) // (w * a)))
                        for s in range(steps):
                            want = plan.step_parts(start + s * w * a, w, a, rank)
                            assert (ids[s * a:(s + 1) * a], rep[s * a:(s + 1) * a], samples[s], tokens[s]) == want
                            assert all(type(x) is int for x in ids) and all(type(x) is bool for x in rep)


@settings(max_examples=30)
@given(layout=st.tuples(st.integers(1, 4), st.integers(1, 3)), order=st.sampled_from(["index", "shuffle"]),
       drop_last=st.booleans(), changes=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 4)), max_size=3))
def test_the_sampler_hands_out_each_steps_parts_also_across_grad_accum_changes(small, layout, order, drop_last,
                                                                               changes):
    """Steps handed out from chunks equal step_parts at the position each starts, whatever set_grad_accum does."""
    from sortpack.reader.plan import EpochPlan

    world, accum = layout
    ix = PackedIndex(small)
    s = PackedSampler(ix, rank=world - 1, world_size=world, grad_accum=accum, order=order, seed=3,
                      drop_last=drop_last, check_rank=False)
    plan = EpochPlan(ix, world, accum, order, seed=3, epoch=0, drop_last=drop_last)
    at, place = dict(changes), 0
    for k, mb in enumerate(s):
        a = (mb.end - mb.position) // world  # the step's accumulation, as it was handed out
        ids, rep, samples, tokens = plan.step_parts(mb.position, world, a, world - 1)
        assert (mb.microbatch, mb.repeat, mb.step_batch, mb.step_tokens) == (ids[place], rep[place], samples, tokens)
        place = 0 if mb.last else place + 1
        if mb.last and k in at:
            s.set_grad_accum(at[k])
