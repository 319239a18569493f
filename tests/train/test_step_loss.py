"""Token-exact loss: step_loss gives the same gradients at any W x A as one pass over the step's samples."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from step_loss_model import (
    TinyCausalLM,
    accumulate,
    collate_and_losses,
    dataset,
    padded_token_losses,
    tokens_of,
)
from torch.utils.data import DataLoader

from sortpack.reader import MicroBatch, PackedIndex, SourceDataset, StepFacts
from sortpack.torch import PackedBatchSampler, pad_collate, step_loss, step_targets

from reader_fixtures import pipeline_index
from support import run_gloo_ranks

pytestmark = pytest.mark.torch
HERE = Path(__file__).resolve().parent
MODES = {"padded": {"max_tokens": 90}, "rows": {"rows": 64, "rows_per_microbatch": 2}}


def build(tmp_path, mode: str) -> tuple[Path, np.ndarray]:
    """Return an index whose micro-batch count is not a multiple of 4 (its last step repeats) and the sizes."""
    rng = np.random.default_rng(5)
    for n in range(40, 80):
        sizes = rng.integers(1, 30, size=n)
        path = pipeline_index(tmp_path / f"{mode}-{n}", sizes, **MODES[mode])
        m = PackedIndex(path).num_microbatches
        if m % 4 == 3 and m >= 7:
            np.save(tmp_path / f"{mode}-{n}-sizes.npy", sizes)
            return path, sizes
    raise AssertionError("no index of the wanted shape")


def full_batch_grads(ix: PackedIndex, sizes, schedule: np.ndarray) -> list[list[np.ndarray]]:
    """Return each step's gradient of the mean loss over its targets, every sample alone in one padded batch."""
    out = []
    for step in schedule:
        ids = [i for p in step for i in ix.microbatch(int(p)).tolist()]  # repeats as often as trained on
        model = TinyCausalLM()
        batch = pad_collate()([tokens_of(i, int(sizes[i])) for i in ids])
        losses = padded_token_losses(model, batch)
        targets = int(sum(max(int(sizes[i]) - 1, 0) for i in ids))
        (losses.sum() / targets).backward()
        out.append([p.grad.numpy().copy() for p in model.parameters()])
    return out


def assert_two_ranks_match(tmp_path, worker_args: list, steps: int, w1: list, full: list) -> None:
    """Run the step-loss worker on two gloo ranks and assert its gradients and ``w1``'s equal ``full``'s."""
    out = tmp_path / "w2.npz"
    run_gloo_ranks([HERE / "step_loss_worker.py", *worker_args, 2, steps, out], timeout=240,
                   env={"CUDA_VISIBLE_DEVICES": ""})
    saved = np.load(out)
    w2 = [[saved[f"arr_{s * len(w1[0]) + k}"] for k in range(len(w1[0]))] for s in range(steps)]
    for s in range(steps):
        for a, b, c in zip(w2[s], w1[s], full[s]):
            np.testing.assert_allclose(a, c, rtol=0, atol=1e-10)
            np.testing.assert_allclose(b, c, rtol=0, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_gradients_equal_at_any_world_and_accumulation(tmp_path, mode):
    path, sizes = build(tmp_path, mode)
    ix = PackedIndex(path)
    steps = -(-ix.num_microbatches // 4)
    one = PackedBatchSampler(ix, rank=0, world_size=1, grad_accum=4)
    schedule = one.schedule()
    assert bool(one.plan().repeated(np.arange(steps * 4)).any())  # the last step repeats a micro-batch
    collate, _ = collate_and_losses(mode)
    w1 = accumulate(TinyCausalLM(), DataLoader(dataset(sizes), batch_sampler=one, collate_fn=collate), mode, steps)
    full = full_batch_grads(ix, sizes, schedule)
    assert_two_ranks_match(tmp_path, [path, tmp_path / f"{path.name}-sizes.npy", mode], steps, w1, full)
    # the usual per-micro-batch mean divided by A is not the step's mean: the test can tell
    _, losses = collate_and_losses(mode)
    model = TinyCausalLM()
    for batch in DataLoader(dataset(sizes), batch_sampler=PackedBatchSampler(ix, rank=0, world_size=1, grad_accum=4),
                            collate_fn=collate):
        token = losses(model, batch)
        (token.sum() / (batch["labels"] != -100).sum() / 4).backward()
        if batch["microbatch"]["last"]:
            break
    naive = [p.grad.numpy() for p in model.parameters()]
    assert max(float(np.abs(a - c).max()) for a, c in zip(naive, full[0])) > 1e-6


def test_step_counts_come_from_the_plan(tmp_path):
    path, sizes = build(tmp_path, "padded")
    ix = PackedIndex(path)
    for rank in range(2):
        for mb in PackedBatchSampler(ix, rank=rank, world_size=2, grad_accum=2):
            pos = np.arange(mb.position, mb.end) % ix.num_microbatches  # the step's 4 micro-batches, repeats too
            ids = [i for p in pos for i in ix.microbatch(int(p)).tolist()]
            assert (mb.step_batch, mb.step_tokens, mb.world_size) == (len(ids), int(sizes[ids].sum()), 2)
            assert mb.tokens == int(sizes[list(mb)].sum())
            info = mb.info()
            assert step_targets(info) == int(sizes[ids].sum()) - len(ids)
            assert step_targets(info, causal=False) == int(sizes[ids].sum())


def test_step_loss_scales_by_the_world_and_warns_on_other_tokens(monkeypatch):
    import sortpack.train.loss as loss_module

    monkeypatch.setattr(loss_module, "_warned", set())  # it warns once per process
    mb = MicroBatch([0, 1], microbatch=0, padded_size=4, facts=StepFacts(step_batch=4, step_tokens=14, world_size=2),
                    tokens=7)
    losses = torch.ones(6, dtype=torch.float64)
    assert float(step_loss(losses, mb)) == pytest.approx(6 * 2 / 10)
    assert float(step_loss(losses, mb, world_size=1, causal=False)) == pytest.approx(6 / 14)
    empty = MicroBatch([0], microbatch=1, facts=StepFacts(step_batch=1, step_tokens=0, world_size=1))
    assert float(step_loss(torch.zeros(0), empty)) == 0.0  # a step without targets: 0, not NaN
    from sortpack.reader.microbatch import Samples

    batch = pad_collate()(Samples([[1, 2, 3], [4, 5, 6]], mb))  # 6 tokens collated, the plan counted 7
    with pytest.warns(RuntimeWarning, match="6 tokens collated, the plan counted 7"):
        step_loss(torch.ones(4), batch)
    with pytest.raises(TypeError, match="step_loss needs"):
        step_loss(torch.ones(1), [1, 2])


def build_labeled(tmp_path, mode: str) -> tuple[Path, list, list]:
    """Return a fine-tuning plan (--labels-column) of prompt-masked samples, stored, and its ids and labels."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from support import run_sortpack

    rng = np.random.default_rng(9)
    n = 70
    sizes = rng.integers(2, 30, size=n)
    ids = [tokens_of(i, int(k)).tolist() for i, k in enumerate(sizes)]
    prompt = [int(rng.integers(0, k)) for k in sizes]  # prompts of 20-80%: masked; some samples all prompt
    labels = [[-100] * p + x[p:] for x, p in zip(ids, prompt)]
    labels[3] = [-100] * len(ids[3])  # no target: dropped as no content
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), tmp_path / "d.parquet")
    opts = ["--max-tokens", "90"] if mode == "padded" else ["--rows", "64", "--rows-per-microbatch", "2"]
    out = tmp_path / f"ft-{mode}"
    proc = run_sortpack(["run", tmp_path / "d.parquet", "-o", out, "--labels-column", "labels",
                         "--store", "input_ids,labels", *opts])
    assert "dropped 1 empty sample" in proc.stdout
    return out, ids, labels


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_masked_labels_give_the_gradient_of_the_mean_over_targets_at_any_world(tmp_path, mode):
    path, ids, labels = build_labeled(tmp_path, mode)
    ix = PackedIndex(path)
    steps = -(-ix.num_microbatches // 4)
    one = PackedBatchSampler(ix, rank=0, world_size=1, grad_accum=4)
    collate, _ = collate_and_losses(mode, "input_ids")
    data = SourceDataset(ix)
    w1 = accumulate(TinyCausalLM(), DataLoader(data, batch_sampler=one, collate_fn=collate), mode, steps)
    full = []
    for step in one.schedule():  # the oracle: one pass over the step's samples, each alone, mean over targets
        sample_ids = [i for p in step for i in ix.microbatch(int(p)).tolist()]
        model = TinyCausalLM()
        batch = pad_collate(key="input_ids")([{"input_ids": ids[i], "labels": labels[i]} for i in sample_ids])
        targets = sum(sum(t != -100 for t in labels[i][1:]) for i in sample_ids)
        (padded_token_losses(model, batch).sum() / targets).backward()
        full.append([p.grad.numpy().copy() for p in model.parameters()])
    mb = next(iter(one))
    assert mb.step_targets < mb.step_tokens - mb.step_batch  # the prompts are not targets
    assert_two_ranks_match(tmp_path, [path, "-", mode], steps, w1, full)
