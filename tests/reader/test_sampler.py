"""sortpack.reader.sampler: iteration, epochs, resume state, consumption and repeated micro-batches."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sortpack.reader import PackedIndex, PackedSampler, lr_scale

from reader_fixtures import exact_index, pipeline_index

ROOT = Path(__file__).resolve().parents[2]


def all_ranks(index, world, accum, **kw):
    return [PackedSampler(index, rank=r, world_size=world, grad_accum=accum, **kw) for r in range(world)]


def _rest(sampler):
    return [mb.microbatch for mb in sampler]


# --- LR -----------------------------------------------------------------------------------------
def test_lr_worked_example(tmp_path):
    # budget 30 tokens: ten samples of 3 tokens, then four of 7 (4 * 7 = 28 <= 30)
    path = pipeline_index(tmp_path / "ix", [3] * 10 + [7] * 4, max_tokens=30)
    s = PackedSampler(path)
    assert s.step_batches().tolist() == [10, 4]
    for method, want in (("linear", [5e-3, 2e-3]), ("sqrt", [1e-3 * math.sqrt(5), 1e-3 * math.sqrt(2)]),
                         ("none", [1e-3, 1e-3])):
        got = []
        for pos in (0, 1):
            got.append(1e-3 * s.lr_scale(2, method, position=pos))
        assert got == pytest.approx(want, rel=1e-15)
    assert s.lr_scale(2, "linear", by="tokens") == 15.0  # 30 tokens / 2
    assert [(mb.step_batch, mb.step_tokens) for mb in s] == [(10, 30), (4, 28)]
    with pytest.raises(ValueError):
        lr_scale(10, 0)


# --- resume ------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["index", "shuffle", "curriculum"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_same_and_other_world_size(tmp_path, order, drop_last):
    rng = np.random.default_rng(5)
    path = pipeline_index(tmp_path / "ix", rng.integers(1, 200, size=700), max_tokens=800, stages=3,
                          rows_per_shard=16)
    world, accum = 4, 2
    for _trial in range(5):
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
    s.step()
    s.step()
    assert s.state_dict()["position"] == 4
    again = PackedSampler(small, grad_accum=2)
    again.load_state_dict(s.state_dict())
    assert [mb.microbatch for mb in again][:2] == [4, 5]
    # the same by reporting what the loop received: the state ends where taken[3]'s step ends
    s = PackedSampler(small, world_size=1, grad_accum=2)
    it = iter(s)
    taken = [next(it) for _ in range(10)]
    for mb in taken[:4]:
        s.consume(mb)
    assert s.state_dict()["position"] == 4 and s.state_dict()["step"] == 2
    s.consume(taken[4])  # the first half of step 2: the state stays at its start
    assert s.position == 4


def test_refuses_a_state_of_another_index(small, tmp_path):
    other = exact_index(tmp_path / "other", 23, seed=9)
    state = PackedSampler(small).state_dict()
    with pytest.raises(ValueError, match="another index"):
        PackedSampler(other).load_state_dict(state)


# --- epochs --------------------------------------------------------------------------------------
def test_iterating_a_finished_epoch_starts_the_next(small):
    s = PackedSampler(small, order="shuffle", seed=1)
    first = _rest(s)
    assert s.epoch == 1 and s.position == 0
    s.set_epoch(1)  # the next epoch already: starts it from its beginning, where it is
    second = _rest(s)
    assert s.epoch == 2 and sorted(first) == sorted(second) and first != second
    s.set_epoch(1)  # another epoch: restart epoch 1 from its beginning
    assert _rest(s) == second


def test_a_peek_does_not_lose_microbatches(small):
    # next(iter(s)); s.set_epoch(0); list(s) gives the whole epoch, not one micro-batch less
    s = PackedSampler(small, rank=0, world_size=1)
    whole = _rest(PackedSampler(small, rank=0, world_size=1))
    next(iter(s))
    s.set_epoch(0)
    assert _rest(s) == whole and len(whole) == 23


def test_set_epoch_starts_the_epoch_from_its_start(small):
    s = PackedSampler(small, world_size=1, grad_accum=2, order="shuffle", seed=4)
    s.set_epoch(2)
    whole = _rest(s)
    s.set_epoch(2)
    it = iter(s)
    for _ in range(5):
        s.consume(next(it))  # the loop trained on two and a half steps, then stopped
    assert s.position == 4
    s.set_epoch(2)  # a new pass over epoch 2: from its start
    assert _rest(s) == whole
    s.load_state_dict({**s.state_dict(), "position": 6, "step": 3, "epoch": 2})
    s.set_epoch(2)  # right after a resume: keeps its place
    assert _rest(s) == whole[6:]


def test_set_grad_accum_continues_from_the_same_position(tmp_path):
    path = exact_index(tmp_path / "ix", 40, seed=6)
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
    rest = [list(it) for it in its]
    assert rest[0][0].step_batch == want_batch and [mb.last for mb in rest[0][:3]] == [False, False, True]
    rest = [[mb.microbatch for mb in r] for r in rest]
    assert rest[0][:3] == [seq[6], seq[8], seq[10]] and rest[1][:3] == [seq[7], seq[9], seq[11]]
    assert len(rest[0]) == len(rest[1])
    assert set(got + rest[0] + rest[1]) == set(range(40))


# --- repeated micro-batches ----------------------------------------------------------------------
@pytest.mark.parametrize("order", ["index", "shuffle"])
def test_microbatches_repeated_to_fill_the_last_step_are_marked(small, order):
    # 23 micro-batches, steps of W*A = 6: the last step repeats micro-batches 0 and 1 (padding)
    ranks = all_ranks(small, 2, 3, order=order, seed=1)
    got = [mb for s in ranks for mb in s]
    assert len(got) == 24 and len([mb for mb in got if mb.repeat]) == 1
    assert sorted(mb.microbatch for mb in got if not mb.repeat) == list(range(23))
    if order == "index":
        assert [(mb.microbatch, mb.repeat) for mb in got[-3:]] == [(19, False), (21, False), (0, True)]
    dropped = all_ranks(small, 2, 3, order=order, drop_last=True)
    assert not any(mb.repeat for s in dropped for mb in s)


def test_warmup_copies_are_marked_repeat(tmp_path):
    lengths = np.random.default_rng(9).integers(1, 128, size=400)
    ix = PackedIndex(pipeline_index(tmp_path / "ix", lengths, max_tokens=256, shapes=(16, 32, 48, 64, 96, 128)))
    ranks = all_ranks(ix, 2, 2, warmup_shapes=True)
    got = [mb for s in ranks for mb in s]
    fresh = [mb.microbatch for mb in got if not mb.repeat]
    assert sorted(fresh) == sorted(set(fresh)) and set(fresh) == set(range(len(ix)))
    assert any(mb.repeat for mb in got)


def test_reader_and_torch_modules_import_without_torch_or_mpi():
    code = ("import sys, sortpack.reader, sortpack.dataset, sortpack.torch, sortpack.reader.sampler; "
            "bad = [m for m in ('torch', 'mpi4py') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)


def test_public_classes_document_their_arguments():
    import inspect

    from sortpack.torch import PackedBatchSampler, PadCollate, SourceDataset, VariableBatchSizeLR, VarlenCollate

    for cls in (PackedSampler, PackedBatchSampler, VariableBatchSizeLR, PadCollate, VarlenCollate,
                PackedIndex, SourceDataset):
        doc = inspect.getdoc(cls)
        missing = [p for p in inspect.signature(cls.__init__).parameters if p != "self" and p not in doc]
        assert not missing, (cls.__name__, missing)


def test_a_resume_position_off_the_step_grid_is_refused_unless_the_width_changed(small):
    # position 5 with 2 micro-batches per step would change what is yielded: refused
    s = PackedSampler(small, world_size=1, grad_accum=2)
    for _ in range(3):
        s.step()
    state = s.state_dict()
    assert (state["position"], state["step"], state["regridded"]) == (6, 3, False)
    for bad in ({"position": 5}, {"position": 7}, {"position": 6, "step": 2}):
        with pytest.raises(ValueError, match="is not on a step boundary") as err:
            PackedSampler(small, world_size=1, grad_accum=2).load_state_dict({**state, **bad})
        assert "\n" not in str(err.value)
    # a legitimate position off the grid: set_grad_accum between steps, then a resume at another world size
    s = PackedSampler(small, world_size=1, grad_accum=2)
    s.step()
    s.set_grad_accum(3)
    s.step()
    state = s.state_dict()
    assert (state["position"], state["step"], state["regridded"]) == (5, 2, True)
    resumed = PackedSampler(small, world_size=1, grad_accum=3)
    resumed.load_state_dict(state)
    assert _rest(resumed) == _rest(s)
    other = PackedSampler(small, rank=0, world_size=2, check_rank=False)
    other.load_state_dict(state)
    other.step()
    assert other.state_dict()["regridded"] and PackedSampler(small, world_size=1).load_state_dict(
        other.state_dict()) is None
    # a new epoch is laid out afresh: back on its grid
    s.set_epoch(1)
    s.step()
    assert s.state_dict()["regridded"] is False
    # states written before the flag are taken as they are
    legacy = {k: v for k, v in PackedSampler(small, world_size=1, grad_accum=2).state_dict().items()
              if k != "regridded"}
    PackedSampler(small, world_size=1, grad_accum=2).load_state_dict({**legacy, "position": 5, "step": 2})


def test_a_state_without_a_step_count_is_refused_in_one_line(small):
    """States without a step count: refused by name, not resumed at a guessed step."""
    s = PackedSampler(small, world_size=1, rank=0)
    it = iter(s)
    next(it), next(it)
    state = s.state_dict()
    assert state["step"] == 2
    old = {k: v for k, v in state.items() if k not in ("step", "regridded")}
    fresh = PackedSampler(small, world_size=1, rank=0)
    with pytest.raises(ValueError, match="^sampler state: no 'step' .*start its epoch again with set_epoch\\)$"):
        fresh.load_state_dict(old)
    fresh.load_state_dict(state)
    assert [mb.microbatch for mb in fresh] == [mb.microbatch for mb in it]
