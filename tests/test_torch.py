"""Tests of sortpack.torch: batch sampler with DataLoader, LR wrapper, collate helpers, the example."""
from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from reader_fixtures import corpus_texts, write_index, write_text_corpus, write_text_index  # noqa: E402
from sortpack.dataset import SourceDataset  # noqa: E402
from sortpack.reader import MicroBatch, Samples  # noqa: E402
from sortpack.torch import (PackedBatchSampler, PackedDataset, VariableBatchSizeLR, pad_collate,  # noqa: E402
                            varlen_collate)

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[1]


def utf8(row):
    return row["text"].encode()


@pytest.fixture
def text_index(tmp_path):
    files = write_text_corpus(tmp_path / "data", n=60)
    return files, write_text_index(tmp_path / "ix", files, max_tokens=120)


def _optimizer(lr=1e-3):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


# --- LR ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,want", [("linear", [5e-3, 2e-3]),
                                         ("sqrt", [1e-3 * math.sqrt(5), 1e-3 * math.sqrt(2)])])
def test_lr_worked_example(tmp_path, method, want):
    path = write_index(tmp_path / "ix", [10, 4], sizes=[3] * 10 + [7] * 4, options={"max_tokens": 30})
    sampler = PackedBatchSampler(path, rank=0, world_size=1)
    opt = _optimizer()
    sched = VariableBatchSizeLR(torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), sampler,
                                ref_batch_size=2, method=method)
    got = []
    for _ in sampler:
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert got == pytest.approx(want, rel=1e-15)


def test_lr_follows_base_schedules_without_compounding(tmp_path):
    path = write_index(tmp_path / "ix", [4, 2, 4, 2])
    sampler = PackedBatchSampler(path, rank=0, world_size=1)
    opt = _optimizer(0.1)
    sched = VariableBatchSizeLR(torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5), sampler, 2, "linear")
    seen = []
    for _ in sampler:
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.1 * 2, 0.05 * 1, 0.025 * 2, 0.0125 * 1])
    bare = _optimizer(0.1)
    sampler.set_epoch(5)
    plain = VariableBatchSizeLR(bare, sampler, 4, "sqrt", step_sampler=False)
    assert plain.get_last_lr() == pytest.approx([0.1 * math.sqrt(sampler.step_batch() / 4)])


def test_lr_state_and_grad_accum_change(tmp_path):
    path = write_index(tmp_path / "ix", [1, 2, 3, 4, 5, 6, 7, 8])
    sampler = PackedBatchSampler(path, rank=0, world_size=2, grad_accum=1)
    opt = _optimizer(1.0)
    sched = VariableBatchSizeLR(torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1)), sampler, 1)
    assert opt.param_groups[0]["lr"] == 1 + 2
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx((3 + 4) / 2)
    sampler.set_grad_accum(2)  # the next step is micro-batches 2..5: the LR follows at once
    assert opt.param_groups[0]["lr"] == pytest.approx((3 + 4 + 5 + 6) / 2)
    state, sstate = sched.state_dict(), sampler.state_dict()
    sampler2 = PackedBatchSampler(path, rank=0, world_size=2)
    opt2 = _optimizer(1.0)
    base2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (s + 1))
    sched2 = VariableBatchSizeLR(base2, sampler2, 1)
    sampler2.load_state_dict(sstate)
    sched2.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
    for o, s in ((opt, sched), (opt2, sched2)):
        o.step()
        s.step()
    # micro-batches 6, 7 and, padding the epoch's tail, 0, 1: 18 samples, base LR 1/3
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"]) == pytest.approx(18 / 3)


# --- collate ----------------------------------------------------------------------------------------
def test_pad_collate_pads_to_the_shape_and_masks_padding_slots():
    mb = MicroBatch([7, 9], microbatch=0, batch_size=4, padded_size=6)
    items = Samples([[1, 2, 3], np.array([4, 5, 6, 7, 8, 9, 10])], mb)
    out = pad_collate(pad_id=-1, attn_mask="causal")(items)
    assert out["input_ids"].tolist() == [[1, 2, 3, -1, -1, -1], [4, 5, 6, 7, 8, 9]] + [[-1] * 6] * 2
    assert out["lengths"].tolist() == [3, 6, 0, 0]
    assert out["real"].tolist() == [True, True, False, False]
    assert out["sample_ids"].tolist() == [7, 9, -1, -1]
    assert out["key_padding_mask"][2:].all() and not out["key_padding_mask"][1].any()
    mask = out["attn_mask"]
    assert mask.shape == (4, 6, 6)
    assert mask[0, 2].tolist() == [True, True, True, False, False, False]
    assert mask[0, 1].tolist() == [True, True, False, False, False, False]
    assert mask[0, 4].tolist() == [False] * 4 + [True, False]  # padding query: itself only
    q = torch.randn(4, 1, 6, 8)
    att = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask[:, None])
    assert torch.isfinite(att).all()
    full = pad_collate(attn_mask="full")(items)["attn_mask"]
    assert full[0, 0].tolist() == [True] * 3 + [False] * 3
    plain = pad_collate(pad_to_multiple=4)([[1], [2, 3, 4, 5, 6]])  # no shape known: longest, rounded
    assert plain["input_ids"].shape == (2, 8)


def test_padding_slots_through_a_dataloader(tmp_path):
    # same-shape groups of 2: micro-batch 1 has 2 real samples in a shape of 3 slots
    path = write_index(tmp_path / "ix", [3, 2, 1, 1], sizes=[2, 3, 4, 5, 5, 6, 7],
                       padded_size=[4, 4, 8, 8], batch_size=[3, 3, 1, 1],
                       options={"same_shape": True, "group_size": 2})
    data = [list(range(1, n + 1)) for n in (2, 3, 4, 5, 5, 6, 7)]
    sampler = PackedBatchSampler(path, rank=0, world_size=2)
    batches = list(DataLoader(PackedDataset(data), batch_sampler=sampler, collate_fn=pad_collate()))
    assert [tuple(b["input_ids"].shape) for b in batches] == [(3, 4), (1, 8)]
    sampler = PackedBatchSampler(path, rank=1, world_size=2)
    first = next(iter(DataLoader(PackedDataset(data), batch_sampler=sampler, collate_fn=pad_collate())))
    assert first["real"].tolist() == [True, True, False] and first["sample_ids"].tolist() == [3, 4, -1]
    assert first["key_padding_mask"][2].all() and first["input_ids"][2].tolist() == [0] * 4


def test_varlen_collate_reproduces_samples():
    seqs = [[1, 2, 3], [4], [5, 6, 7, 8], [9, 10]]
    out = varlen_collate()(seqs)
    cu = out["cu_seqlens"].tolist()
    assert out["cu_seqlens"].dtype == torch.int32 and cu == [0, 3, 4, 8, 10]
    assert [out["input_ids"][a:b].tolist() for a, b in zip(cu, cu[1:])] == seqs
    assert out["position_ids"].tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 0, 1] and out["max_seqlen"] == 4


def test_varlen_collate_rows_mode(tmp_path):
    # two packed rows of length 8: samples 0,1 | 2,3 and a padding row (same-shape slot)
    path = write_index(tmp_path / "ix", [4], sample_ids=[10, 11, 12, 13], sizes=np.arange(14) % 5 + 1,
                       padded_size=[8], batch_size=[3], row_splits=[[0, 2, 4]])
    sampler = PackedBatchSampler(path, rank=0, world_size=1)
    mb = next(iter(sampler))
    assert mb.row_splits == [0, 2, 4] and mb.padded_size == 8 and mb.batch_size == 3
    seqs = {10: [1, 2, 3], 11: [4, 5], 12: [6], 13: [7, 8, 9, 10, 11]}
    out = varlen_collate()(PackedDataset(seqs).__getitems__(mb))
    ids, cu, idx = out["input_ids"], out["cu_seqlens"].tolist(), out["seq_index"].tolist()
    assert ids.view(3, 8).tolist() == [[1, 2, 3, 4, 5, 0, 0, 0], [6, 7, 8, 9, 10, 11, 0, 0], [0] * 8]
    real = {j: ids[a:b].tolist() for j, a, b in zip(idx, cu, cu[1:]) if j >= 0}
    assert real == {0: seqs[10], 1: seqs[11], 2: seqs[12], 3: seqs[13]}
    assert out["position_ids"].view(3, 8)[1].tolist() == [0, 0, 1, 2, 3, 4, 0, 1]
    assert int(out["token_mask"].sum()) == 11


# --- DataLoader ----------------------------------------------------------------------------------------
def test_dataloader_with_workers_yields_the_index_shapes(text_index):
    files, index = text_index
    texts = corpus_texts(files)
    collate = pad_collate(pad_id=0, tokenize=utf8)
    runs = []
    for workers in (0, 2):
        sampler = PackedBatchSampler(index, rank=1, world_size=2, grad_accum=2, order="shuffle", seed=3)
        loader = DataLoader(SourceDataset(index, columns=["text"]), batch_sampler=sampler,
                            collate_fn=collate, num_workers=workers)
        expected = sampler.schedule().ravel().tolist()
        batches = list(loader)
        assert len(batches) == len(expected)
        for batch, p in zip(batches, expected):
            shape = sampler.index.shape(p)
            assert tuple(batch["input_ids"].shape) == shape
            ids = batch["sample_ids"].tolist()
            assert ids == sampler.index.microbatch(p).tolist()
            for row, i in zip(batch["input_ids"], ids):
                want = list(texts[i].encode())[:shape[1]]
                assert row[:len(want)].tolist() == want
        runs.append([b["input_ids"].tolist() for b in batches])
    assert runs[0] == runs[1]


def test_any_map_style_dataset_works(text_index):
    files, index = text_index
    texts = [list(t.encode()) for t in corpus_texts(files)]
    def first(dataset):
        sampler = PackedBatchSampler(index, rank=0, world_size=1)
        return next(iter(DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate()))), sampler

    plain, _ = first(texts)  # shape from the items: longest item, rows = samples
    shaped, sampler = first(PackedDataset(texts))  # shape from the index
    assert tuple(shaped["input_ids"].shape) == sampler.index.shape(0)
    assert plain["input_ids"].shape[0] == shaped["input_ids"].shape[0]
    assert plain["input_ids"].shape[1] == max(len(texts[i]) for i in sampler.index.microbatch(0))


def test_prefetching_loader_resumes_exactly(text_index):
    _, index = text_index
    dataset = SourceDataset(index, columns=["text"])

    def run(sampler, steps=None):
        opt = _optimizer()
        sched = VariableBatchSizeLR(opt, sampler, 4)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate(tokenize=utf8),
                            num_workers=2, prefetch_factor=4)
        seen = []
        for i, batch in enumerate(loader):
            seen.append(batch["sample_ids"].tolist())
            if (i + 1) % 2 == 0:
                sched.step()
                if steps is not None and len(seen) == 2 * steps:
                    break
        return seen

    whole = run(PackedBatchSampler(index, rank=0, world_size=2, grad_accum=2, order="shuffle", seed=1))
    first = PackedBatchSampler(index, rank=0, world_size=2, grad_accum=2, order="shuffle", seed=1)
    head = run(first, steps=2)
    state = first.state_dict()
    assert state["position"] == 2 * 4
    second = PackedBatchSampler(index, rank=0, world_size=2, grad_accum=1)
    second.load_state_dict(state)
    assert head + run(second) == whole


def test_example_trains_with_two_gloo_ranks(text_index, tmp_path):
    _, index = text_index
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "examples" / "train_tiny.py"), str(index),
                               "--steps", "3", "--grad-accum", "2"],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=180)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    for r, out in enumerate(outs):
        lines = [line for line in out.splitlines() if line.startswith(f"rank {r} step")]
        assert len(lines) == 3, out
        assert all("batch shapes" in line and "tokens" in line and "lr" in line for line in lines)
    lrs = [[line.split(" lr ")[1].split()[0] for line in out.splitlines() if " lr " in line] for out in outs]
    assert lrs[0] == lrs[1]  # every rank steps with the same LR
