"""Tests of the numpy reader core: index opening, step plans, orders, LR scale, resume."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from reader_fixtures import random_index, write_index  # noqa: E402
from sortpack.errors import SortpackError  # noqa: E402
from sortpack.reader import KeyedPermutation, PackedIndex, PackedSampler, lr_scale  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small(tmp_path):
    return random_index(tmp_path / "ix", np.random.default_rng(0), 23, rows_per_shard=5)


def all_ranks(index, world, accum, **kw):
    return [PackedSampler(index, rank=r, world_size=world, grad_accum=accum, **kw) for r in range(world)]


# --- opening ------------------------------------------------------------------------------------
def test_open_exposes_counts_columns_and_zero_copy_ids(small):
    ix = PackedIndex(small)
    assert ix.num_microbatches == 23 and len(ix._shards) == 5
    counts = ix["num_samples"]
    assert counts.dtype == np.int32 and len(counts) == 23 and ix.num_samples == counts.sum()
    starts = np.concatenate(([0], np.cumsum(counts)))
    for i in range(23):  # ids are consecutive in the fixture, across shard boundaries
        ids = ix.microbatch(i)
        assert ids.dtype == np.int64 and not ids.flags.owndata and not ids.flags.writeable
        assert ids.tolist() == list(range(starts[i], starts[i + 1]))
    for name in ("max_size", "padded_size", "tokens", "batch_size", "stage"):
        assert len(ix[name]) == 23
        assert ix.take(name, [22, 0, 7]).tolist() == ix[name][[22, 0, 7]].tolist()
    assert ix.range_sum("tokens", 3, 19) == ix["tokens"][3:19].sum()
    with pytest.raises(IndexError):
        ix.microbatch(23)


def test_refuses_unknown_version_and_bad_shard_size(small, tmp_path):
    manifest = json.loads((small / "manifest.json").read_text())
    bad = tmp_path / "v2"
    bad.mkdir()
    for f in small.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "manifest.json").write_text(json.dumps({**manifest, "version": 3}))
    with pytest.raises(SortpackError, match="version 3 is not supported"):
        PackedIndex(bad)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with open(bad / manifest["shards"][1]["file"], "ab") as fh:
        fh.write(b"x")
    with pytest.raises(SortpackError, match="bytes, the manifest says"):
        PackedIndex(bad)


def test_open_reads_a_small_fraction_of_a_large_index(tmp_path):
    smaps = Path("/proc/self/smaps")
    if not smaps.exists():
        pytest.skip("needs /proc/self/smaps")
    rng = np.random.default_rng(1)
    counts = rng.integers(1, 16, size=200_000)
    path = write_index(tmp_path / "big", counts, sizes=rng.integers(1, 1000, size=int(counts.sum())))
    ix = PackedIndex(path)
    for entry in ix.manifest["shards"]:  # map every shard and read a little of each
        ix.microbatch(entry["first"] + 5), ix.shape(entry["first"] + 5)
    root, touched, current = str(path.resolve()), 0, None
    for line in smaps.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and "-" in parts[0] and not parts[0].endswith(":"):
            current = parts[5] if len(parts) > 5 else ""
        elif parts and parts[0] == "Rss:" and current and current.startswith(root):
            touched += int(parts[1]) * 1024
    total = sum(f.stat().st_size for f in path.iterdir())
    assert touched < 0.1 * total, (touched, total)


# --- permutation --------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64, 65, 1000, 4099])
def test_keyed_permutation_is_a_bijection(n):
    perm = KeyedPermutation(n, seed=7, epoch=3)
    images = perm.array(np.arange(n))
    assert sorted(images.tolist()) == list(range(n))
    assert [perm(i) for i in range(min(n, 200))] == images[:200].tolist()
    if n >= 17:
        assert images.tolist() != KeyedPermutation(n, seed=7, epoch=4).array(np.arange(n)).tolist()


# --- the property test ----------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 5000), world=st.integers(1, 64), accum=st.integers(1, 4),
       drop_last=st.booleans(), order=st.sampled_from(["index", "shuffle"]), seed=st.integers(0, 3),
       data=st.data())
def test_every_rank_gets_equal_steps_and_agrees_on_lr(m, world, accum, drop_last, order, seed, data):
    with tempfile.TemporaryDirectory() as tmp:
        path = random_index(Path(tmp) / "ix", np.random.default_rng(m), m, rows_per_shard=997)
        ix = PackedIndex(path)
        samplers = all_ranks(ix, world, accum, order=order, seed=seed, drop_last=drop_last)
        scheds = [s.schedule() for s in samplers]
        steps = {sc.shape[0] for sc in scheds}
        assert len(steps) == 1 and {len(s) for s in samplers} == {steps.pop() * accum}
        n = scheds[0].shape[0]
        g = world * accum
        if drop_last:
            assert n == m // g
        else:
            assert n == max(1, math.ceil(m / g))
        seen = Counter(np.concatenate([sc.ravel() for sc in scheds]).tolist())
        if drop_last:
            assert max(seen.values(), default=1) == 1 and len(seen) == n * g
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
    path = write_index(tmp_path / "ix", [2, 3, 1])
    samplers = all_ranks(path, 4, 2)
    assert [s.schedule().tolist() for s in samplers] == [[[0, 1]], [[1, 2]], [[2, 0]], [[0, 1]]]
    assert all(len(s) == 0 for s in all_ranks(path, 4, 2, drop_last=True))


# --- LR -----------------------------------------------------------------------------------------
def test_lr_worked_example(tmp_path):
    # budget 30 tokens: ten samples of 3 tokens, then four of 7 (4 * 7 = 28 <= 30)
    sizes = np.array([3] * 10 + [7] * 4)
    path = write_index(tmp_path / "ix", [10, 4], sizes=sizes, options={"max_tokens": 30, "budget": "padded"})
    s = PackedSampler(path)
    assert s.step_batches().tolist() == [10, 4]
    for method, want in (("linear", [5e-3, 2e-3]), ("sqrt", [1e-3 * math.sqrt(5), 1e-3 * math.sqrt(2)]),
                         ("none", [1e-3, 1e-3])):
        got = []
        for pos in (0, 1):
            got.append(1e-3 * s.lr_scale(2, method, position=pos))
        assert got == pytest.approx(want, rel=1e-15)
    assert s.lr_scale(2, "linear", by="tokens") == 15.0  # 30 tokens / 2
    with pytest.raises(ValueError):
        lr_scale(10, 0)


# --- resume ------------------------------------------------------------------------------------
def _rest(sampler):
    return [mb.microbatch for mb in sampler]


@pytest.mark.parametrize("order", ["index", "shuffle", "curriculum"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_same_and_other_world_size(tmp_path, order, drop_last):
    rng = np.random.default_rng(5)
    stage = np.repeat([0, 1, 2], [40, 50, 47])
    path = random_index(tmp_path / "ix", rng, 137, rows_per_shard=16, stage=stage)
    world, accum = 4, 2
    for trial in range(5):
        ranks = all_ranks(path, world, accum, order=order, seed=11, drop_last=drop_last)
        for s in ranks:
            s.set_epoch(3)
        full = [s.schedule().ravel().tolist() for s in ranks]
        stop = int(rng.integers(0, ranks[0].num_steps))
        its = [iter(s) for s in ranks]
        for _ in range(stop * accum):
            for it in its:
                next(it)
        state = ranks[0].state_dict()
        assert state["position"] == stop * world * accum and state["epoch"] == 3
        # same W: the rest is what the uninterrupted run yields
        for r in range(world):
            fresh = PackedSampler(path, rank=r, world_size=world, grad_accum=1, order="index", seed=0)
            fresh.load_state_dict(state)
            fresh.set_epoch(3)  # a training loop calls this again after resuming: no restart
            assert _rest(fresh) == full[r][stop * accum:]
        # another W: the new ranks cover the remaining micro-batches exactly once
        plan = ranks[0].plan()
        remaining = plan.packed_array(np.arange(state["position"], plan.length)).tolist()
        new_world = int(rng.integers(1, 9))
        got = []
        for r in range(new_world):
            fresh = PackedSampler(path, rank=r, world_size=new_world)
            fresh.load_state_dict(state)
            got.extend(_rest(fresh))
        g = new_world * accum
        if drop_last:
            assert len(got) == len(remaining) // g * g
            assert sorted(got) == sorted(remaining[:len(got)])
        else:
            pad = (-len(remaining)) % g
            assert sorted(got) == sorted(remaining + plan.packed_array(np.arange(pad) % plan.length).tolist())


def test_finishing_an_epoch_moves_the_state_to_the_next(small):
    want = PackedSampler(small, world_size=2, grad_accum=2, order="shuffle")
    want.set_epoch(1)
    want_ids = want.schedule().ravel().tolist()
    for track in (False, True):
        s = PackedSampler(small, world_size=2, grad_accum=2, order="shuffle")
        s.track_steps = track
        n = s.num_steps
        assert len(list(s)) == 2 * n
        if track:  # the loop has not finished its steps yet
            assert s.epoch == 0 and s.position == 0
            for _ in range(n):
                s.step()
        assert s.epoch == 1 and s.position == 0 and len(s) == 2 * n
        fresh = PackedSampler(small, world_size=2, grad_accum=2)
        fresh.load_state_dict(s.state_dict())
        fresh.set_epoch(1)
        assert [mb.microbatch for mb in fresh] == want_ids


def test_state_survives_prefetch_when_steps_are_recorded(small):
    s = PackedSampler(small, world_size=1, grad_accum=2)
    it = iter(s)
    taken = [next(it) for _ in range(10)]  # a DataLoader ran ahead by 6 micro-batches
    del taken
    s.step()
    s.step()
    assert s.state_dict()["position"] == 4
    again = PackedSampler(small, grad_accum=2)
    again.load_state_dict(s.state_dict())
    assert [mb.microbatch for mb in again][:2] == [4, 5]


def test_refuses_a_state_of_another_index(small, tmp_path):
    other = random_index(tmp_path / "other", np.random.default_rng(9), 23)
    state = PackedSampler(small).state_dict()
    with pytest.raises(ValueError, match="another index"):
        PackedSampler(other).load_state_dict(state)


# --- epochs, orders -----------------------------------------------------------------------------
def test_epochs_shuffle_whole_steps_identically_on_every_rank(tmp_path):
    path = random_index(tmp_path / "ix", np.random.default_rng(2), 64)
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


def test_iterating_a_finished_epoch_starts_the_next(small):
    s = PackedSampler(small, order="shuffle", seed=1)
    first = _rest(s)
    assert s.epoch == 1 and s.position == 0
    s.set_epoch(1)  # the next epoch already: a no-op
    second = _rest(s)
    assert s.epoch == 2 and sorted(first) == sorted(second) and first != second
    s.set_epoch(1)  # another epoch: restart epoch 1 from its beginning
    assert _rest(s) == second


def test_largest_first_puts_the_costliest_step_first(tmp_path):
    rng = np.random.default_rng(4)
    path = random_index(tmp_path / "ix", rng, 50, padded_size=rng.integers(1, 50, size=50) * 8)
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
    stage = np.repeat([0, 1, 2], 20)
    path = random_index(tmp_path / "ix", np.random.default_rng(3), 60, stage=stage)
    ix = PackedIndex(path)
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
    rng = np.random.default_rng(8 + uniform)
    m, group = 120, 4
    if uniform:  # same-shape groups of 4: blocks of W*A = 4 are uniform and get moved
        shapes = rng.integers(0, 5, size=m // group).repeat(group)
    else:
        shapes = rng.integers(0, 6, size=m)
    padded = np.array([16, 32, 48, 64, 96, 128])[shapes]
    bsz = np.array([8, 4, 3, 2, 2, 1])[shapes]
    counts = np.minimum(bsz, rng.integers(1, 9, size=m))
    options = {"same_shape": True, "group_size": group} if uniform else {}
    path = write_index(tmp_path / "ix", counts, padded_size=padded, batch_size=bsz, options=options)
    ix = PackedIndex(path)
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
    path = write_index(tmp_path / "ix", [2] * 24, options={"same_shape": True, "group_size": 4})
    for world, accum in ((4, 1), (2, 2), (8, 1), (4, 3), (2, 1), (1, 1)):
        PackedSampler(path, world_size=world, grad_accum=accum)
    for world, accum in ((3, 1), (6, 1), (2, 3)):
        with pytest.raises(ValueError, match="same-shape groups of 4"):
            PackedSampler(path, world_size=world, grad_accum=accum)
    s = PackedSampler(path, world_size=2, grad_accum=2)
    with pytest.raises(ValueError):
        s.set_grad_accum(3)


def test_set_grad_accum_continues_from_the_same_position(tmp_path):
    path = random_index(tmp_path / "ix", np.random.default_rng(6), 40)
    ix = PackedIndex(path)
    ranks = all_ranks(ix, 2, 1, order="shuffle", seed=3)
    plan = ranks[0].plan()
    seq = plan.packed_array(np.arange(plan.length)).tolist()
    its = [iter(s) for s in ranks]
    got = [next(it).microbatch for _ in range(3) for it in its]  # three steps of 2
    for s in ranks:
        s.set_grad_accum(3)
    assert all(s.position == 6 for s in ranks)
    want_batch = int(ix["num_samples"][seq[6:12]].sum())
    assert all(s.step_batch() == want_batch for s in ranks)
    assert ranks[0].lr_scale(4, "linear") == want_batch / 4
    rest = [[mb.microbatch for mb in it] for it in its]
    assert rest[0][:3] == [seq[6], seq[8], seq[10]] and rest[1][:3] == [seq[7], seq[9], seq[11]]
    assert len(rest[0]) == len(rest[1])
    assert set(got + rest[0] + rest[1]) == set(range(40))


def test_reader_and_torch_modules_import_without_torch_or_mpi():
    code = ("import sys, sortpack.reader, sortpack.dataset, sortpack.torch; "
            "bad = [m for m in ('torch', 'mpi4py') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)
