"""PlanLoader: the same batches as a DataLoader, an exact resume state, errors raised in the loop; lazy stored rows."""
from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader

from sortpack.reader import Samples
from sortpack.reader.lazy_rows import TableSamples
from sortpack.torch import PackedBatchSampler, PlanLoader, SourceDataset, pad_collate, varlen_collate

from support import ROOT, run_sortpack

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def token_plan(tmp_path_factory):
    """A plan over pre-tokenized samples with the token ids stored (``--store input_ids``), and the ids."""
    tmp = tmp_path_factory.mktemp("loader")
    rng = np.random.default_rng(4)
    ids = [rng.integers(2, 1000, int(n)).astype(np.int32).tolist() for n in rng.integers(1, 300, 400)]
    pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "n": np.arange(400)}),
                   tmp / "tokens.parquet", row_group_size=64)
    run_sortpack(["run", tmp / "tokens.parquet", "-o", tmp / "plan", "--column", "input_ids", "--max-tokens", "2048",
                  "--store", "input_ids,n", "--quiet"], env={"SORTPACK_TEST_DATA_ROWS": "90"})
    return tmp / "plan", ids


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if torch.is_tensor(a[k]):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("collate", [pad_collate(key="input_ids"), varlen_collate(key="input_ids")])
@pytest.mark.parametrize("prefetch", [1, 4])
def test_same_batches_as_a_dataloader(token_plan, collate, prefetch):
    plan, ids = token_plan
    flags = dict(rank=1, world_size=2, grad_accum=2, order="shuffle", seed=3)
    ref = list(DataLoader(SourceDataset(plan), batch_sampler=PackedBatchSampler(plan, **flags), collate_fn=collate))
    sampler = PackedBatchSampler(plan, **flags)
    got = list(PlanLoader(SourceDataset(plan), sampler, collate, prefetch=prefetch))
    assert len(got) == len(ref) == len(PackedBatchSampler(plan, **flags)) > 5
    for a, b in zip(got, ref):
        _same(a, b)
    # and the stored token ids are the samples' own
    batch = got[0]
    for row, sid in enumerate(batch["sample_ids"].tolist()):
        n = int(batch["lengths"][row]) if "lengths" in batch else len(ids[sid])
        if collate.__class__.__name__ == "PadCollate":
            assert batch["input_ids"][row, :n].tolist() == ids[sid]
    assert sampler.state_dict()["epoch"] == 1  # every step received: the next epoch


def test_resume_state_counts_what_the_loop_received_not_the_prefetch(token_plan):
    plan, _ = token_plan
    flags = dict(rank=0, world_size=1, grad_accum=2, order="shuffle", seed=5)
    whole = [b["sample_ids"].tolist() for b in PlanLoader(SourceDataset(plan), PackedBatchSampler(plan, **flags),
                                                          pad_collate(key="input_ids"))]
    for stop in (1, 2, 5, len(whole) - 1):
        sampler = PackedBatchSampler(plan, **flags)
        loader = PlanLoader(SourceDataset(plan), sampler, pad_collate(key="input_ids"), prefetch=8)
        it = iter(loader)
        head = [next(it)["sample_ids"].tolist() for _ in range(stop)]
        state = loader.state_dict()  # the thread has fetched up to 8 batches further
        assert state["position"] == (stop // 2) * 2  # the last whole step received
        fresh = PackedBatchSampler(plan, **flags)
        again = PlanLoader(SourceDataset(plan), fresh, pad_collate(key="input_ids"))
        again.load_state_dict(state)
        rest = [b["sample_ids"].tolist() for b in again]
        assert head[:(stop // 2) * 2] + rest == whole
        # the same loader, iterated again after a break, continues where the loop stood
        del it
        assert [b["sample_ids"].tolist() for b in loader] == whole[(stop // 2) * 2:]


def test_a_failure_in_the_thread_is_raised_in_the_loop(token_plan):
    plan, _ = token_plan

    def broken(items):
        if items.microbatch.step == 2:
            raise KeyError("no such column")
        return pad_collate(key="input_ids")(items)

    sampler = PackedBatchSampler(plan, rank=0, world_size=1)
    got = []
    with pytest.raises(KeyError, match="no such column"):
        for batch in PlanLoader(SourceDataset(plan), sampler, broken):
            got.append(batch)
    assert len(got) == 2 and sampler.position == 2
    with pytest.raises(ValueError, match="prefetch"):
        PlanLoader(SourceDataset(plan), sampler, broken, prefetch=0)


def test_pin_memory_without_cuda_warns_and_changes_nothing(token_plan):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the pinned path is tested below")
    plan, _ = token_plan
    with pytest.warns(UserWarning, match="no CUDA device"):
        loader = PlanLoader(SourceDataset(plan), PackedBatchSampler(plan), pad_collate(key="input_ids"),
                            pin_memory=True)
    n = len(loader)
    assert not loader.pin_memory and len(list(loader)) == n > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_pins_every_tensor(token_plan):
    plan, _ = token_plan
    loader = PlanLoader(SourceDataset(plan), PackedBatchSampler(plan), pad_collate(key="input_ids"), pin_memory=True)
    for batch in loader:
        assert all(v.is_pinned() for v in batch.values() if torch.is_tensor(v))


def test_stored_rows_are_built_only_when_asked_for(token_plan):
    plan, ids = token_plan
    sampler = PackedBatchSampler(plan, rank=0, world_size=1)
    mb = next(iter(sampler))
    items = SourceDataset(plan).__getitems__(mb)
    assert isinstance(items, TableSamples) and not items.built and len(items) == len(mb)
    pad_collate(key="input_ids")(items)  # reads the Arrow slice
    assert not items.built
    # any other use gets the rows, as before
    assert [r["input_ids"] for r in items] == [ids[i] for i in mb] and items.built
    fresh = SourceDataset(plan, transform=lambda r: r["n"]).__getitems__(mb)
    assert fresh[0] == mb[0] and list(fresh) == list(mb) and fresh == list(mb)
    fresh = SourceDataset(plan).__getitems__(mb)
    back = pickle.loads(pickle.dumps(fresh))
    assert isinstance(back, Samples) and list(back) == list(fresh) and back.microbatch == mb
    assert [r["n"] for r in SourceDataset(plan).__getitems__(mb)][::-1] == \
        [r["n"] for r in reversed(SourceDataset(plan).__getitems__(mb))]


def _doc_block(path: Path, marker: str) -> str:
    text = path.read_text()
    at = text.index(marker)
    return re.search(r"```python\n(.*?)```", text[at:], re.S).group(1)


def test_the_documented_stored_data_loop_runs_as_written(token_plan, tmp_path, monkeypatch):
    plan, _ = token_plan
    readme = _doc_block(ROOT / "README.md", "Train from `plan/` alone")
    guide = _doc_block(ROOT / "docs" / "training.md", "## Stored data: the fastest loader")
    assert readme == guide  # one loop, shown twice
    os.symlink(plan, tmp_path / "plan")
    monkeypatch.chdir(tmp_path)
    import sortpack.torch

    received = []

    class Recording(PlanLoader):
        def __iter__(self):
            for batch in super().__iter__():
                received.append(batch)
                yield batch

    monkeypatch.setattr(sortpack.torch, "PlanLoader", Recording)
    ns: dict = {}
    exec(compile(readme, "README.md", "exec"), ns)
    sampler = ns["sampler"]
    # every epoch of the loop, in the sampler's order, with the resume state at its end
    want = []
    ref = PackedBatchSampler(str(plan), grad_accum=sampler.grad_accum, order=sampler.order, seed=sampler.seed)
    for e in range(ns["E"]):
        ref.set_epoch(e)
        want += [list(mb) for mb in ref]
    assert [b["sample_ids"].tolist() for b in received] == want
    assert sampler.state_dict()["epoch"] == ns["E"]


def _who_prepares(plan, loop_body, prefetch=4, read=0.0):
    """Return the names of the threads that collated each batch of an epoch, and the batches' sample ids in order.

    ``read``: seconds each collate also sleeps (a slow read that lets go of the GIL).
    """
    import threading
    import time

    names = []

    def collate(items):
        names.append(threading.current_thread().name)
        if read:
            time.sleep(read)
        return pad_collate(key="input_ids")(items)

    loader = PlanLoader(SourceDataset(plan), PackedBatchSampler(plan, rank=0, world_size=1, order="shuffle", seed=1),
                        collate, prefetch=prefetch)
    got = []
    for batch in loader:
        got.append(batch["sample_ids"].tolist())
        loop_body()
    return names, got


def test_a_loop_that_comes_straight_back_prepares_its_own_batches(token_plan):
    """No thread switch per batch when the loop does not let go of the GIL: the loop collates inline."""
    plan, _ = token_plan
    names, got = _who_prepares(plan, lambda: None)
    want = [b["sample_ids"].tolist() for b in DataLoader(
        SourceDataset(plan), batch_sampler=PackedBatchSampler(plan, rank=0, world_size=1, order="shuffle", seed=1),
        collate_fn=pad_collate(key="input_ids"))]
    assert got == want and len(names) == len(want) > 10
    # a loaded machine may hold the loop back between batches now and then: then the thread helps
    assert names.count("MainThread") >= len(names) * 0.6, names


@pytest.mark.parametrize("step,read", [(0.01, 0.0), (0.002, 0.005)])
def test_the_thread_prepares_ahead_while_the_loop_is_away(token_plan, step, read):
    """A training step that lets go of the GIL (a CUDA wait; here a sleep) overlaps with the next batches' preparing.

    Also when a batch takes longer to prepare than the step (a slow read): the thread still overlaps part of it.
    """
    import time

    plan, _ = token_plan
    names, got = _who_prepares(plan, lambda: time.sleep(step), read=read)
    assert names.count("sortpack-PlanLoader") >= len(names) * 0.5, names
    assert len(got) == len(names)


def test_a_loop_held_back_by_other_work_keeps_preparing_its_own_batches(token_plan, monkeypatch):
    """Away long, but neither waiting nor running (preempted on a busy machine): no thread switch for it.

    The thread would need the cores and the GIL the loop needs itself; here the loop's absences
    (a sleep) are made to look like preemption: its thread's waits and CPU time do not move.
    """
    import time

    from sortpack.reader import loader as loader_module

    plan, _ = token_plan
    monkeypatch.setattr(loader_module, "_usage", lambda: (7, 1.0))
    names, got = _who_prepares(plan, lambda: time.sleep(0.003))
    assert names.count("MainThread") >= len(names) * 0.9, names
    assert len(got) == len(names)


def test_leaving_the_loop_early_stops_the_thread(token_plan):
    import threading
    import time

    plan, _ = token_plan
    sampler = PackedBatchSampler(plan, rank=0, world_size=1)
    loader = PlanLoader(SourceDataset(plan), sampler, pad_collate(key="input_ids"))
    for k, _batch in enumerate(loader):
        time.sleep(0.005)  # the thread fills the queue meanwhile
        if k == 3:
            break
    run = loader._pass
    assert run is None or not run.thread.is_alive()
    loader.close()
    assert not [t for t in threading.enumerate() if t.name == "sortpack-PlanLoader" and t.is_alive()]
