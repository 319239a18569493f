"""Step trace and skip: ``inspect --step/--sample`` agree with the sampler; skip_steps/skip_samples are exact."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sortpack.reader import PackedIndex, PackedSampler
from sortpack.reader.plan import StepOrder
from sortpack.reader.sampler_state import Layout
from sortpack.reader.trace import sample_trace, step_trace

from reader_fixtures import pipeline_index
from support import run_sortpack

LENGTHS = np.random.default_rng(0).integers(1, 200, size=92)


@pytest.fixture
def small(tmp_path):
    """23 micro-batches (92 samples, at most 4 each) in shards of 5; sample i has size LENGTHS[i]."""
    return pipeline_index(tmp_path / "ix", LENGTHS, max_tokens=1000, max_samples=4, rows_per_shard=5)


def ranks(index, world, accum, **kw):
    return [PackedSampler(index, rank=r, world_size=world, grad_accum=accum, **kw) for r in range(world)]


def run(samplers, epochs=2):
    """Return {run_step: [per rank: [per micro-batch: MicroBatch]]} over ``epochs`` epochs, iterated as a loop does."""
    steps: dict = {}
    for s in samplers:
        for e in range(epochs):
            s.set_epoch(e)
            for mb in s:
                steps.setdefault(mb.run_step, [[] for _ in samplers])[s.rank].append(mb)
    return steps


FLAGS = [dict(order="index"), dict(order="shuffle", seed=3), dict(order="shuffle", seed=5, drop_last=True),
         dict(order="curriculum", seed=1, largest_first=True), dict(order="shuffle", seed=2, warmup_shapes=True)]


# --- trace -------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("world,accum", [(1, 1), (2, 2), (3, 1)])
def test_step_trace_is_what_every_rank_trains_on(small, flags, world, accum):
    got = run(ranks(small, world, accum, **flags))
    spe = ranks(small, world, accum, **flags)[0].steps_per_epoch
    assert sorted(got) == list(range(2 * spe))
    for run_step, per_rank in got.items():
        t = step_trace(small, run_step, Layout(world, accum), StepOrder(**flags))
        assert (t["epoch"], t["step"]) == divmod(run_step, spe)
        assert [[mb["sample_ids"] for mb in r["microbatches"]] for r in t["ranks"]] == \
            [[list(mb) for mb in mbs] for mbs in per_rank]
        assert [[mb["repeat"] for mb in r["microbatches"]] for r in t["ranks"]] == \
            [[mb.repeat for mb in mbs] for mbs in per_rank]
        assert t["step_samples"] == per_rank[0][0].step_batch and t["step_tokens"] == per_rank[0][0].step_tokens
        # the same step counted within its epoch
        inner = step_trace(small, t["step"], Layout(world, accum), StepOrder(**flags), epoch=t["epoch"])
        assert inner["ranks"] == t["ranks"]


@pytest.mark.parametrize("flags", FLAGS)
def test_sample_trace_lists_every_step_and_rank_of_a_sample(small, flags):
    world, accum = 2, 2
    got = run(ranks(small, world, accum, **flags), epochs=2)
    spe = ranks(small, world, accum, **flags)[0].steps_per_epoch
    for epoch in (0, 1):
        t = sample_trace(small, range(92), Layout(world, accum), StepOrder(**flags), epoch=epoch)
        assert [s["sample_id"] for s in t["samples"]] == list(range(92))
        for s in t["samples"]:
            want = sorted((rs, r, a, mb.repeat) for rs in range(epoch * spe, (epoch + 1) * spe)
                          for r, mbs in enumerate(got[rs]) for a, mb in enumerate(mbs) if s["sample_id"] in mb)
            assert sorted((x["run_step"], x["rank"], x["accum"], x["repeat"]) for x in s["steps"]) == want
            assert PackedIndex(small).microbatch(s["microbatch"])[s["place"]] == s["sample_id"]


@pytest.mark.slow
def test_inspect_cli_step_and_sample(small):
    out = run_sortpack(["inspect", small, "--world-size", "2", "--grad-accum", "2", "--step", "7", "--order",
                        "shuffle", "--seed", "3", "--json"]).stdout
    t = json.loads(out)
    assert t == step_trace(small, 7, Layout(2, 2), StepOrder("shuffle", seed=3))
    ids = t["ranks"][1]["microbatches"][0]["sample_ids"]
    text = run_sortpack(["inspect", small, "--world-size", "2", "--grad-accum", "2", "--order", "shuffle",
                         "--seed", "3", "--epoch", "1", "--sample", str(ids[0])]).stdout
    assert f"sample {ids[0]}:" in text and "run step 7 (step 1) rank 1 micro-batch 0" in text
    human = run_sortpack(["inspect", small, "--world-size", "2", "--grad-accum", "2", "--step", "7", "--order",
                          "shuffle", "--seed", "3"]).stdout
    assert human.splitlines()[0].startswith("run step 7 (epoch 1 step 1; W=2 A=2 order shuffle seed 3")
    assert "ids " + " ".join(map(str, ids)) in human


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--sample", "999"], "--sample 999: not in the plan"),
    (["--step", "-1"], "--step -1: must be >= 0"),
    (["--step", "6", "--epoch", "0", "--world-size", "4"], "--step 6: epoch 0 has 6 steps"),
    (["--step", "1", "--sample", "3"], "--step and --sample: give one of them"),
    (["--step", "0", "--world-size", "0"], "--world-size 0: must be >= 1"),
    # ids and sizes no int64 holds: the same one line, not an OverflowError traceback
    (["--sample", str(2**63)], f"--sample {2**63}: not in the plan"),
    (["--sample", "3", "--sample", str(-2**63 - 1)], f"--sample {-2**63 - 1}: not in the plan"),
    (["--sample", "3", "--world-size", str(2**63)], "micro-batches per step, more than inspect traces"),
    (["--step", "0", "--grad-accum", str(2**40)], "micro-batches per step, more than inspect traces"),
    (["--world-size", str(2**63)], "micro-batches per step, more than inspect reports on"),
    # the rule of `run --seed`: a seed is a 64-bit key, 0 to 2^64-1
    (["--sample", "3", "--order", "shuffle", "--seed", "-1"], "--seed -1: must be >= 0"),
    (["--step", "0", "--order", "shuffle", "--seed", str(2**64)], f"--seed {2**64}: must be below 2^64"),
])
def test_inspect_trace_errors_are_one_line(small, args, message):
    proc = run_sortpack(["inspect", small, *args], check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert proc.stdout == ""


def test_sample_trace_of_a_big_plan_is_vectorised(tmp_path):
    # 200 000 micro-batches: a Python loop over them would take seconds
    import time

    from reader_fixtures import write_index

    counts = np.random.default_rng(1).integers(1, 8, size=200_000)
    path = write_index(tmp_path / "big", counts, rows_per_shard=50_000)
    want = [0, int(counts.sum()) // 2, int(counts.sum()) - 1]
    t0 = time.perf_counter()
    t = sample_trace(path, want, Layout(8, 4), StepOrder("shuffle", seed=1))
    assert time.perf_counter() - t0 < 5
    assert [len(s["steps"]) >= 1 for s in t["samples"]] == [True] * 3


# --- skip_steps -------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", FLAGS[:3])
def test_skip_steps_leaves_out_exactly_those_steps(small, flags):
    world, accum = 2, 2
    spe = ranks(small, world, accum, **flags)[0].steps_per_epoch
    skip = [(1, 3), spe + 0, range(2 * spe - 1, 2 * spe + 5)]  # across the epoch boundary, and the last step
    full = run(ranks(small, world, accum, **flags))
    got = run(ranks(small, world, accum, skip_steps=skip, **flags))
    gone = {1, 2, spe, 2 * spe - 1}
    assert sorted(got) == sorted(set(full) - gone)
    for rs, per_rank in got.items():
        # the steps kept keep their number, micro-batches and step size, hence their LR
        assert [[(list(mb), mb.step_batch, mb.step_tokens) for mb in mbs] for mbs in per_rank] == \
            [[(list(mb), mb.step_batch, mb.step_tokens) for mb in mbs] for mbs in full[rs]]
    s = ranks(small, world, accum, skip_steps=skip, **flags)[0]
    assert s.num_steps == spe - 2 and len(s) == (spe - 2) * accum
    assert len(s.schedule()) == spe - 2 and len(s.step_batches()) == spe - 2
    assert s.step_batches().tolist() == [full[rs][0][0].step_batch for rs in range(spe) if rs not in gone]
    assert s.lr_scale(1) == full[0][0][0].step_batch
    s.step()  # a loop counting its steps: step 0 done, the next one to train is step 3
    assert s.lr_scale(1) == full[3][0][0].step_batch
    assert [mb.run_step for mb in s][::accum] == [rs for rs in range(1, spe) if rs not in gone]


def test_resume_with_skips_is_exact(small):
    world, accum, flags = 2, 1, dict(order="shuffle", seed=7)
    skip = [(3, 5), 9]
    whole = run(ranks(small, world, accum, skip_steps=skip, **flags), epochs=1)
    kept = sorted(whole)
    for stop in range(1, len(kept)):
        for restart_skips in (skip, None, [(3, 5)]):
            samplers = ranks(small, world, accum, skip_steps=skip, **flags)
            states = []
            for s in samplers:
                it = iter(s)
                for _ in range(stop):
                    s.consume(next(it))
                states.append(s.state_dict())
            # a restart: new samplers (with the skips again, without, or some), the checkpoint's state
            fresh = ranks(small, world, accum, skip_steps=restart_skips, **flags)
            for f, st in zip(fresh, states):
                f.load_state_dict(st)
                f.set_epoch(st["epoch"])
            rest = {}
            for f in fresh:
                for mb in f:
                    rest.setdefault(mb.run_step, [[] for _ in fresh])[f.rank].append(list(mb))
            assert sorted(rest) == kept[stop:]
            assert all(rest[rs] == [[list(mb) for mb in mbs] for mbs in whole[rs]] for rs in rest)


def test_a_restart_skips_steps_ahead_of_its_checkpoint(small):
    flags = dict(order="shuffle", seed=1)
    first = PackedSampler(small, grad_accum=2, **flags)
    it = iter(first)
    for _ in range(4):  # two steps trained
        first.consume(next(it))
    state = first.state_dict()
    again = PackedSampler(small, grad_accum=2, skip_steps=[(3, 5)], **flags)
    again.load_state_dict(state)
    assert [mb.run_step for mb in again][::2] == [2] + list(range(5, first.steps_per_epoch))
    assert again.state_dict()["skip_steps"] == [[3, 5]]


def test_trailing_skipped_steps_end_the_epoch_when_consumed(small):
    s = PackedSampler(small, grad_accum=2, skip_steps=[(10, 12)])
    assert s.steps_per_epoch == 12 and s.num_steps == 10
    it = iter(s)
    for _ in range(20):
        s.consume(next(it))
    assert (s.epoch, s.position) == (1, 0)
    assert [mb.run_step for mb in s][:2] == [12, 12]


@pytest.mark.parametrize("bad", [[(5, 2)], [(-1, 3)], ["x"], [range(0, 10, 2)]])
def test_bad_skip_steps_raise(small, bad):
    with pytest.raises(ValueError, match="skip_steps"):
        PackedSampler(small, skip_steps=bad)


# --- skip_samples -----------------------------------------------------------------------------
@pytest.mark.parametrize("flags", FLAGS[:3])
def test_skip_samples_takes_them_out_and_step_sizes_follow(small, flags):
    world, accum = 2, 2
    drop = [5, 17, 40, 41, 88]
    full = run(ranks(small, world, accum, **flags))
    got = run(ranks(small, world, accum, skip_samples={i: int(LENGTHS[i]) for i in drop}, **flags))
    assert sorted(got) == sorted(full)
    for rs, per_rank in got.items():
        mbs = [mb for r in per_rank for mb in r]
        assert not set(drop) & {i for mb in mbs for i in mb}
        ref = [mb for r in full[rs] for mb in r]
        for mb, old in zip(mbs, ref):
            assert list(mb) == [i for i in old if i not in drop]
            assert (mb.batch_size, mb.padded_size, mb.microbatch) == (old.batch_size, old.padded_size, old.microbatch)
        # step_batch and step_tokens count exactly what the loop trains on, over all ranks (repeats too)
        assert mbs[0].step_batch == sum(len(mb) for mb in mbs)
        assert mbs[0].step_tokens == sum(int(LENGTHS[i]) for mb in mbs for i in mb)
        if not set(drop) & {i for mb in ref for i in mb}:  # an untouched step keeps its LR
            assert (mbs[0].step_batch, mbs[0].step_tokens) == (ref[0].step_batch, ref[0].step_tokens)
    s = ranks(small, world, accum, skip_samples={i: int(LENGTHS[i]) for i in drop}, **flags)[0]
    assert s.step_batches().tolist() == [got[rs][0][0].step_batch for rs in range(s.steps_per_epoch)]
    assert s.step_batches("tokens").tolist() == [got[rs][0][0].step_tokens for rs in range(s.steps_per_epoch)]
    assert s.step_batch() == got[0][0][0].step_batch


def test_skip_samples_sizes_come_from_stored_data(tmp_path, small):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["x" * int(n) for n in LENGTHS]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet")
    plan = tmp_path / "stored"
    run_sortpack(["run", tmp_path / "t.parquet", "-o", plan, "--column", "text", "--max-tokens", "1000",
                  "--max-samples", "4", "--store", "text", "--quiet"])
    s = PackedSampler(plan, skip_samples=[5, 17])
    assert s.skips.sizes == {5: int(LENGTHS[5]), 17: int(LENGTHS[17])}
    with pytest.raises(ValueError, match=r"skip_samples: the size of sample 5 is not known .*\{id: size\}"):
        PackedSampler(small, skip_samples=[5])
    with pytest.raises(ValueError, match="skip_samples: sample id 1000 is not in the plan"):
        PackedSampler(small, skip_samples={1000: 3})


def test_skip_samples_in_rows_mode_keeps_each_row_in_place(tmp_path):
    lengths = np.random.default_rng(3).integers(5, 60, size=200)
    plan = pipeline_index(tmp_path / "rows", lengths, max_tokens=400, rows=100, rows_per_microbatch=4)
    ix = PackedIndex(plan)
    full = list(PackedSampler(plan))
    victim = full[2]
    drop = [victim[victim.row_splits[1]]]  # the first sample of the second row
    got = list(PackedSampler(plan, skip_samples={drop[0]: int(lengths[drop[0]])}))
    mb = got[2]
    assert list(mb) == [i for i in victim if i != drop[0]]
    splits = np.asarray(ix.row_splits(victim.microbatch))
    assert mb.row_splits == (splits - (splits > splits[1])).tolist()
    assert [list(m) for m in got[:2]] == [list(m) for m in full[:2]]


def test_the_documented_loss_spike_restart_works_with_the_batch_sampler(tmp_path):
    # docs/reader.md: PackedBatchSampler("plan/", grad_accum=2, order="shuffle", seed=0, skip_steps=[(8, 11)],
    # skip_samples=[43]) raised TypeError: the subclass re-declared its parent's constructor and drifted
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sortpack.torch import PackedBatchSampler

    pq.write_table(pa.table({"text": ["x" * int(n) for n in LENGTHS]}), tmp_path / "t.parquet")
    plan = tmp_path / "plan"
    run_sortpack(["run", tmp_path / "t.parquet", "-o", plan, "--column", "text", "--max-tokens", "1000",
                  "--max-samples", "4", "--store", "text", "--quiet"])
    before = PackedBatchSampler(plan, grad_accum=2, order="shuffle", seed=0)
    checkpoint = {"sampler": before.state_dict()}
    sampler = PackedBatchSampler(str(plan) + "/", grad_accum=2, order="shuffle", seed=0,
                                 skip_steps=[(8, 11)], skip_samples=[43])
    sampler.load_state_dict(checkpoint["sampler"])
    got = list(sampler)
    assert all(43 not in mb for mb in got) and {mb.run_step for mb in got}.isdisjoint({8, 9, 10})
    assert sampler.skips.sizes == {43: int(LENGTHS[43])}


def test_the_batch_sampler_takes_exactly_the_samplers_parameters():
    import inspect

    from sortpack.reader import PackedSampler
    from sortpack.torch import PackedBatchSampler

    # one class under two names: no re-declared constructor or docstring to drift
    assert PackedBatchSampler is PackedSampler
    assert inspect.signature(PackedBatchSampler) == inspect.signature(PackedSampler)


BAD_SKIPS = {
    "negative size": (dict(skip_samples={5: -1000}), "skip_samples: the size of sample 5 is -1000"),
    "size past its micro-batch": (dict(skip_samples={5: 5000}), "the size of sample 5 is 5000, more than the"),
    "fractional size": (dict(skip_samples={5: 2.5}), "skip_samples: the size of sample 5 is 2.5"),
    "bool size": (dict(skip_samples={5: True}), "skip_samples: the size of sample 5 is True"),
    "huge size": (dict(skip_samples={5: 10**30}), "skip_samples: the size of sample 5 is 10000"),
    "string size": (dict(skip_samples={5: "7"}), "skip_samples: the size of sample 5 is '7'"),
    "fractional id": (dict(skip_samples={5.5: 3}), "skip_samples: 5.5 is not a sample id"),
    "bool id": (dict(skip_samples=[True]), "skip_samples: True is not a sample id"),
    "negative id": (dict(skip_samples={-1: 3}), "skip_samples: -1 is not a sample id"),
    "huge id": (dict(skip_samples={10**30: 3}), "skip_samples: 10000"),
    "string ids": (dict(skip_samples="43"), "skip_samples: '43' is not"),
    "bool step": (dict(skip_steps=[True]), "skip_steps: True is not a step"),
    "fractional step": (dict(skip_steps=[2.5]), "skip_steps: 2.5 is not a step"),
    "fractional pair": (dict(skip_steps=[(1, 2.5)]), "skip_steps: \\(1, 2.5\\) is not a step"),
    "bool pair": (dict(skip_steps=[(False, True)]), "skip_steps: \\(False, True\\) is not a step"),
    "huge step": (dict(skip_steps=[10**30]), "skip_steps: 10000"),
    "huge pair": (dict(skip_steps=[(0, 10**30)]), "skip_steps: \\(0, 10000"),
    "negative step": (dict(skip_steps=[-3]), "skip_steps: -3 is not a step"),
    "reversed pair": (dict(skip_steps=[(5, 2)]), "not a range of step numbers"),
    "triple": (dict(skip_steps=[(1, 2, 3)]), "skip_steps: \\(1, 2, 3\\) is not a step"),
    "string steps": (dict(skip_steps="8"), "skip_steps: '8' is not"),
    "range step 2": (dict(skip_steps=[range(0, 10, 2)]), "must have step 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_SKIPS))
def test_every_bad_skip_is_one_value_error(small, case):
    kw, message = BAD_SKIPS[case]
    with pytest.raises(ValueError, match=message) as err:
        PackedSampler(small, **kw)
    assert type(err.value) is ValueError and "\n" not in str(err.value)


def test_skips_that_are_numpy_integers_are_fine(small):
    s = PackedSampler(small, skip_steps=[np.int64(2), (np.int32(4), np.int64(6)), range(7, 8)],
                      skip_samples={np.int64(5): np.int32(int(LENGTHS[5]))})
    assert s.skips.ranges.tolist() == [[2, 3], [4, 6], [7, 8]] and s.skips.sizes == {5: int(LENGTHS[5])}
    # a sampler loads its own state (a negative size once made that fail)
    PackedSampler(small, skip_samples={5: int(LENGTHS[5])}).load_state_dict(s.state_dict())
