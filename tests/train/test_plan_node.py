"""``PlanNode``: a torchdata node that yields what ``PlanLoader`` yields and resumes at another world size exactly.

The oracle is the plan itself: over an epoch every micro-batch of the index is trained once
(the tail's repeats, ``repeat=True``, aside), whatever the world size before and after a
stop. Ranks are simulated in one process here (each node its own rank of W); the slow test
runs them as real gloo ranks.
"""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nodes = pytest.importorskip("torchdata.nodes")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sortpack.reader import PackedIndex  # noqa: E402
from sortpack.torch import PackedBatchSampler, PlanLoader, PlanNode, SourceDataset, pad_collate  # noqa: E402

from reader_fixtures import pipeline_index  # noqa: E402
from support import ROOT, run_gloo_ranks  # noqa: E402

NUM_MB = 23


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """An index of 23 micro-batches (92 texts, at most 4 each), written by the real pipeline."""
    lengths = np.random.default_rng(0).integers(1, 200, size=92)
    return pipeline_index(tmp_path_factory.mktemp("node") / "ix", lengths, max_tokens=1000, max_samples=4)


def rank_nodes(plan, world: int, accum: int = 1, order: str = "index", state=None) -> list[PlanNode]:
    """Return the ``world`` ranks' nodes (rank r of W, in this process), reset to ``state`` when given."""
    out = [PlanNode(PackedBatchSampler(plan, rank=r, world_size=world, grad_accum=accum, order=order, seed=5))
           for r in range(world)]
    if state is not None:
        for node in out:
            node.reset(state)
    return out


def train(ranks: list[PlanNode], steps: int | None = None) -> tuple[list, dict]:
    """Take ``steps`` optimizer steps (None: to the epoch's end) on every rank; return their micro-batches and state."""
    accum = ranks[0].sampler.grad_accum
    got: list = []
    done = 0
    while steps is None or done < steps:
        try:
            step = [next(node) for node in ranks for _ in range(accum)]
        except StopIteration:
            break
        got += step
        done += 1
    states = [node.get_state() for node in ranks]
    assert all(s == states[0] for s in states)  # every rank's state is the same place
    return got, states[0]


def trained(mbs) -> Counter:
    """Return how often each micro-batch of epoch 0 was trained on (repeats that fill the last step aside).

    A stop after the epoch's last step resumes at epoch 1: its micro-batches are not epoch 0's.
    """
    return Counter(mb.microbatch for mb in mbs if not mb.repeat and mb.epoch == 0)


@pytest.mark.parametrize("order", ["index", "shuffle"])
@pytest.mark.parametrize("after", [1, 3])
def test_a_stop_at_two_ranks_resumes_at_one_and_three_with_every_microbatch_once(plan, after, order):
    whole, _ = train(rank_nodes(plan, 2, order=order))
    assert trained(whole) == Counter(range(NUM_MB))
    first, state = train(rank_nodes(plan, 2, order=order), steps=4)
    rest, _ = train(rank_nodes(plan, after, order=order, state=state))
    assert trained(first + rest) == Counter(range(NUM_MB))
    ids = Counter(i for mb in first + rest if not mb.repeat for i in mb)
    assert ids == Counter(i for mb in whole if not mb.repeat for i in mb)  # the same sample ids


@settings(deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 2), st.integers(0, 12), st.sampled_from(["index",
                                                                                                      "shuffle"]))
def test_any_stop_resumes_at_any_world_size(plan, before, after, accum, steps, order):
    first, state = train(rank_nodes(plan, before, accum, order), steps=steps)
    rest, _ = train(rank_nodes(plan, after, accum, order, state=state))
    assert trained(first + rest) == Counter(range(NUM_MB))


def test_the_node_yields_what_plan_loader_yields(plan):
    collate = pad_collate(tokenize=lambda row: list(row["text"].encode()))
    data = SourceDataset(plan)
    loader = PlanLoader(data, PackedBatchSampler(plan, rank=1, world_size=2), collate)
    node = PlanNode(PackedBatchSampler(plan, rank=1, world_size=2), data, collate)
    want, got = list(loader), list(node)
    assert len(want) == len(got) == 12
    for a, b in zip(want, got):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k]
                                            for k in a)
    assert node.get_state()["sampler"] == loader.state_dict()  # the same place: the epoch's end


def test_a_state_inside_a_step_resumes_at_the_same_world_size_only(plan):
    node = rank_nodes(plan, 2, accum=2)[0]
    head = [next(node)]
    state = node.get_state()
    assert state["within_step"] == 1 and not head[0].last
    again = rank_nodes(plan, 2, accum=2, state=state)[0]
    assert [mb.microbatch for mb in again] == [mb.microbatch for mb in rank_nodes(plan, 2, accum=2)[0]][1:]
    other = rank_nodes(plan, 3, accum=2)[0]
    with pytest.raises(ValueError, match="inside a step .* at that world size only"):
        other.reset(state)


def test_a_pass_cut_short_and_started_again_is_the_next_epoch(plan):
    node = rank_nodes(plan, 1)[0]
    next(node)
    node.reset()
    assert next(node).epoch == 1
    full = rank_nodes(plan, 1)[0]
    assert len(list(full)) == NUM_MB
    full.reset()  # after a whole epoch: the next one, from its start
    assert [next(full).epoch, full.get_state()["sampler"]["position"]] == [1, 1]


def test_a_bad_state_is_refused_and_leaves_the_node_where_it_was(plan, tmp_path):
    node = rank_nodes(plan, 2)[0]
    next(node)
    before = node.get_state()
    other = pipeline_index(tmp_path / "other", np.arange(1, 40), max_tokens=100)
    foreign = rank_nodes(other, 1)[0].get_state()
    with pytest.raises(ValueError, match="belongs to another index"):
        node.reset(foreign)
    with pytest.raises(ValueError, match="'within_step' is -1"):
        node.reset({**before, "within_step": -1})
    with pytest.raises(ValueError, match="unknown key"):
        node.reset({**before, "extra": 1})
    assert node.get_state() == before
    with pytest.raises(TypeError, match="PackedSampler"):
        PlanNode(list(range(3)))


def test_torchdata_prefetcher_and_loader_carry_the_state_across_world_sizes(plan):
    def loader(rank: int, world: int):
        return nodes.Loader(nodes.Prefetcher(PlanNode(PackedBatchSampler(plan, rank=rank, world_size=world)), 2))

    two = [loader(r, 2) for r in range(2)]
    its = [iter(x) for x in two]
    first = [next(it) for _ in range(3) for it in its]
    state = two[0].state_dict()
    three = [loader(r, 3) for r in range(3)]
    for x in three:
        x.load_state_dict(state)
    rest = [mb for x in three for mb in x]
    assert trained(first + rest) == Counter(range(NUM_MB))


@pytest.mark.slow
def test_gloo_ranks_stop_at_two_and_resume_at_one_and_three(plan, tmp_path):
    worker = ROOT / "tests" / "train" / "plan_node_worker.py"

    def run(ranks: int, mode: str) -> dict:
        out = tmp_path / f"{mode}-{ranks}.json"
        run_gloo_ranks([worker, plan, mode, tmp_path / "state.json", out], ranks=ranks)
        return json.loads(out.read_text())

    whole = run(2, "whole")
    first = run(2, "stop")
    assert len(first["steps"]) == 3
    for world in (1, 3):
        rest = run(world, "resume")
        steps = first["steps"] + rest["steps"]
        assert sorted(mb for step in steps for mb, _ in step) == list(range(NUM_MB))  # once each, none repeated
        assert sorted(i for step in steps for _, ids in step for i in ids) == \
            sorted(i for step in whole["steps"] for _, ids in step for i in ids)
        assert all(len(step) == world for step in rest["steps"][:-1])  # the last may hold repeats (left out)
    assert PackedIndex(plan).num_microbatches == NUM_MB
