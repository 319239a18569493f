"""sortpack.reader.microbatch: a micro-batch's step facts are one record per step, with one name each."""
from __future__ import annotations

import pytest

from sortpack.reader import MicroBatch, PackedSampler, StepFacts

STEP_KEYS = {"epoch", "step", "position", "end", "run_step", "step_batch", "step_tokens", "world_size",
             "step_attention", "step_targets"}
OWN_KEYS = {"microbatch", "last", "tokens", "num_samples", "repeat", "attention", "targets"}


def test_the_micro_batches_of_a_step_share_one_facts_record(small):
    ranks = [PackedSampler(small, rank=r, world_size=2, grad_accum=3) for r in range(2)]
    for s in ranks:
        mbs = list(s)
        for k in range(0, len(mbs), 3):
            step = mbs[k:k + 3]
            assert all(mb.facts is step[0].facts for mb in step)  # built once per step, not per micro-batch
            assert [mb.last for mb in step] == [False, False, True]
    a, b = (list(s) for s in ranks)
    # every rank computes the same facts for the same step
    assert [mb.facts for mb in a[::3]] == [mb.facts for mb in b[::3]]


@pytest.mark.parametrize("skip", [False, True])
def test_info_is_the_attributes_with_one_name_per_fact(small, skip):
    skips = {"skip_samples": dict.fromkeys(range(0, 40, 3), 1), "skip_steps": [1]} if skip else {}
    for mb in PackedSampler(small, rank=1, world_size=2, grad_accum=2, order="shuffle", seed=3, **skips):
        info = mb.info()
        assert set(info) == STEP_KEYS | OWN_KEYS  # no second name (the old step_samples) for step_batch
        assert info == {**{k: getattr(mb, k) for k in STEP_KEYS | OWN_KEYS - {"num_samples"}}, "num_samples": len(mb)}
        assert all(type(v) is (bool if k in ("last", "repeat") else int) for k, v in info.items())
        assert info is not mb.info() and mb.info() == info  # a new dict each time: a loop may change its copy
        # the sampler's quick construction makes what the constructor makes
        same = MicroBatch(list(mb), mb.microbatch, mb.batch_size, mb.padded_size, mb.row_splits, facts=mb.facts,
                          last=mb.last, tokens=mb.tokens, repeat=mb.repeat, source=mb.source,
                          attention=mb.attention, targets=mb.targets, size2=mb.size2)
        assert same == mb and same.info() == info and vars(same) == {k: v for k, v in vars(mb).items() if k != "_plain"}
    assert not hasattr(mb, "step_samples")


def test_a_small_constructor_and_read_only_step_facts():
    facts = StepFacts(epoch=2, step=5, position=40, end=48, run_step=21, step_batch=30, step_tokens=900,
                      world_size=4)
    mb = MicroBatch([3, 1, 4], 7, 4, 128, facts=facts, last=False, tokens=250, repeat=True, source="web")
    assert (mb.epoch, mb.step, mb.position, mb.end, mb.run_step) == (2, 5, 40, 48, 21)
    assert (mb.step_batch, mb.step_tokens, mb.world_size, mb.batch_size, mb.padded_size) == (30, 900, 4, 4, 128)
    assert mb.info()["source"] == "web" and list(mb) == [3, 1, 4]
    with pytest.raises(AttributeError):
        mb.step_batch = 1  # one home: the step's record
    with pytest.raises(AttributeError):
        facts.step_tokens = 1  # type: ignore[misc]  # shared by the step's micro-batches: immutable
    with pytest.raises(TypeError):
        MicroBatch([1], 0, step_batch=4, step_tokens=9)  # the old per-fact keywords are gone
    plain = MicroBatch([8, 9])  # not from a sampler: step 0 of epoch 0 on one rank
    assert plain.info() == {**dict.fromkeys(STEP_KEYS, 0), "world_size": 1, "microbatch": -1, "last": True,
                            "tokens": 0, "num_samples": 2, "repeat": False, "attention": 0, "targets": 0}
