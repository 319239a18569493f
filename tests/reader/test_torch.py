"""sortpack.torch (the LR wrapper of sortpack.train, collate and samplers with torch): collate, DataLoader, resume."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import itertools

from torch.utils.data import DataLoader

from sortpack.reader import MicroBatch, PackedIndex, Samples
from sortpack.torch import (
    PackedBatchSampler,
    PackedDataset,
    SourceDataset,
    VariableBatchSizeLR,
    pad_collate,
    varlen_collate,
)

from reader_fixtures import corpus_texts, exact_index, pipeline_index, write_text_corpus, write_text_index
from support import run_gloo_ranks

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[2]


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
@pytest.mark.slow
def test_lr_worked_example(tmp_path, method, want):
    path = pipeline_index(tmp_path / "ix", [3] * 10 + [7] * 4, max_tokens=30)
    sampler = PackedBatchSampler(path, rank=0, world_size=1)
    opt = _optimizer()
    sched = VariableBatchSizeLR(torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), sampler,
                                ref_batch_size=2, method=method)
    got, followed = [], []
    for _mb in sampler:
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert got == pytest.approx(want, rel=1e-15)
    bare = VariableBatchSizeLR(_optimizer(), ref_batch_size=2, method=method)  # no sampler: follow batches
    for mb in PackedBatchSampler(path, rank=0, world_size=1):
        bare.follow(mb)
        followed.append(bare.get_last_lr()[0])
    assert followed == pytest.approx(want, rel=1e-15)


@pytest.mark.slow
def test_lr_follows_base_schedules_without_compounding(tmp_path):
    path = exact_index(tmp_path / "ix", 4, per=3)
    counts = PackedIndex(path)["num_samples"].tolist()
    sampler = PackedBatchSampler(path, rank=0, world_size=1)
    opt = _optimizer(0.1)
    sched = VariableBatchSizeLR(torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5), sampler, 2, "linear")
    seen = []
    for _ in sampler:
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.1 * 0.5 ** s * c / 2 for s, c in enumerate(counts)])
    bare = _optimizer(0.1)
    sampler.set_epoch(5)
    plain = VariableBatchSizeLR(bare, sampler, 4, "sqrt")
    assert plain.get_last_lr() == pytest.approx([0.1 * math.sqrt(sampler.step_batch() / 4)])


def test_lr_state_and_grad_accum_change(tmp_path):
    path = exact_index(tmp_path / "ix", 8, per=3)
    n = PackedIndex(path)["num_samples"].tolist()
    sampler = PackedBatchSampler(path, rank=0, world_size=2, grad_accum=1)
    opt = _optimizer(1.0)
    sched = VariableBatchSizeLR(torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1)), sampler, 1)
    assert opt.param_groups[0]["lr"] == n[0] + n[1]
    opt.step()
    sampler.step()  # the loop records its step (or consume()s its batches)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx((n[2] + n[3]) / 2)
    sampler.set_grad_accum(2)  # the next step is micro-batches 2..5: refresh() re-applies the LR
    sched.refresh()
    assert opt.param_groups[0]["lr"] == pytest.approx((n[2] + n[3] + n[4] + n[5]) / 2)
    state, sstate = sched.state_dict(), sampler.state_dict()
    sampler2 = PackedBatchSampler(path, rank=0, world_size=2)
    opt2 = _optimizer(1.0)
    base2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (s + 1))
    sched2 = VariableBatchSizeLR(base2, sampler2, 1)
    sampler2.load_state_dict(sstate)
    sched2.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
    for o, smp, s in ((opt, sampler, sched), (opt2, sampler2, sched2)):
        o.step()
        smp.step()
        s.step()
    # micro-batches 6, 7 and, padding the epoch's tail, 0, 1, base LR 1/3
    want = (n[6] + n[7] + n[0] + n[1]) / 3
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"]) == pytest.approx(want)


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
    # same-shape groups of 3: the last group's micro-batches have fewer samples than slots
    lengths = np.random.default_rng(0).integers(1, 60, size=40)
    ix = PackedIndex(pipeline_index(tmp_path / "ix", lengths, max_tokens=100, group_size=3, same_shape=True))
    short = np.flatnonzero(ix["batch_size"] > ix["num_samples"])
    assert short.size  # the pipeline does write padding slots
    data = [list(range(1, n + 1)) for n in lengths]
    batches = []
    for rank in range(3):
        sampler = PackedBatchSampler(ix, rank=rank, world_size=3)
        mine = list(DataLoader(PackedDataset(data), batch_sampler=sampler, collate_fn=pad_collate()))
        assert [tuple(b["input_ids"].shape) for b in mine] == [ix.shape(p) for p in sampler.schedule().ravel()]
        batches.extend(mine)
    for b in batches:
        p = b["microbatch"]["microbatch"]
        real = int(ix["num_samples"][p])
        assert b["real"].tolist() == [True] * real + [False] * (int(ix["batch_size"][p]) - real)
        assert b["sample_ids"].tolist()[real:] == [-1] * (int(ix["batch_size"][p]) - real)
        assert b["key_padding_mask"][real:].all() and not b["input_ids"][real:].any()
    assert any(b["microbatch"]["microbatch"] in short for b in batches)


def test_varlen_collate_reproduces_samples():
    seqs = [[1, 2, 3], [4], [5, 6, 7, 8], [9, 10]]
    out = varlen_collate()(seqs)
    cu = out["cu_seqlens"].tolist()
    assert out["cu_seqlens"].dtype == torch.int32 and cu == [0, 3, 4, 8, 10]
    assert [out["input_ids"][a:b].tolist() for a, b in itertools.pairwise(cu)] == seqs
    assert out["position_ids"].tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 0, 1] and out["max_seqlen"] == 4


def test_varlen_collate_rows_mode(tmp_path):
    # an index built with --rows: each micro-batch is 2 rows of 64 tokens, samples packed whole
    lengths = np.random.default_rng(2).integers(1, 40, size=60)
    ix = PackedIndex(pipeline_index(tmp_path / "ix", lengths, max_tokens=128, rows=64, rows_per_microbatch=2))
    seqs = {i: list(range(100 * i, 100 * i + int(n))) for i, n in enumerate(lengths)}
    sampler = PackedBatchSampler(ix, rank=0, world_size=1)
    for mb in sampler:
        assert mb.padded_size == 64 and len(mb.row_splits) == mb.batch_size + 1
        out = varlen_collate(pad_id=-1)(PackedDataset(seqs).__getitems__(mb))
        ids, cu, idx = out["input_ids"], out["cu_seqlens"].tolist(), out["seq_index"].tolist()
        rows = ids.view(mb.batch_size, 64).tolist()
        for r, (a, b) in enumerate(zip(mb.row_splits, mb.row_splits[1:])):
            packed = [t for j in range(a, b) for t in seqs[mb[j]]]
            assert rows[r] == packed + [-1] * (64 - len(packed))
        real = {j: ids[a:b].tolist() for j, a, b in zip(idx, cu, cu[1:]) if j >= 0}
        assert real == {j: seqs[i] for j, i in enumerate(mb)}
        positions = out["position_ids"].tolist()
        assert all(positions[a:b] == list(range(b - a)) for a, b in itertools.pairwise(cu))
        assert int(out["token_mask"].sum()) == sum(len(seqs[i]) for i in mb)


def test_collate_marks_repeated_microbatches_not_real(small):
    # 23 micro-batches in steps of 2 x 3: the last step repeats micro-batch 0 on rank 1
    sampler = PackedBatchSampler(small, rank=1, world_size=2, grad_accum=3)
    data = PackedDataset({i: [1] * 3 for i in range(PackedIndex(small).num_samples)})
    for collate in (pad_collate(), varlen_collate()):
        batches = list(DataLoader(data, batch_sampler=sampler, collate_fn=collate))
        assert [b["microbatch"]["repeat"] for b in batches] == [False] * 11 + [True]
        assert all(b["real"].all() for b in batches[:-1]) and not batches[-1]["real"].any()
        sampler.set_epoch(0)


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


def _train(index, dataset, sampler, steps=None, lr=True):
    """The README loop: consume every batch, an optimizer step after each step's last micro-batch."""
    opt = _optimizer()
    sched = VariableBatchSizeLR(opt, sampler, 4) if lr else None
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate(tokenize=utf8),
                        num_workers=2, prefetch_factor=4)
    seen, done = [], 0
    for batch in loader:
        sampler.consume(batch)
        seen.append(batch["sample_ids"].tolist())
        if batch["microbatch"]["last"]:
            opt.step()
            if sched is not None:
                sched.step()
            done += 1
            if steps is not None and done == steps:
                break
    return seen


def test_prefetching_loader_resumes_exactly(text_index):
    _, index = text_index
    dataset = SourceDataset(index, columns=["text"])
    whole = _train(index, dataset, PackedBatchSampler(index, rank=0, world_size=2, grad_accum=2, order="shuffle",
                                                      seed=1))
    first = PackedBatchSampler(index, rank=0, world_size=2, grad_accum=2, order="shuffle", seed=1)
    head = _train(index, dataset, first, steps=2)
    state = first.state_dict()
    assert state["position"] == 2 * 4
    second = PackedBatchSampler(index, rank=0, world_size=2, grad_accum=1)
    second.load_state_dict(state)
    assert head + _train(index, dataset, second) == whole


@pytest.fixture(scope="module")
def resume_index(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    files = write_text_corpus(tmp / "data", n=120, seed=3)
    return write_text_index(tmp / "ix", files, max_tokens=90)


@pytest.mark.slow
@settings(max_examples=6)  # each example starts DataLoader workers
@given(data=st.data(), with_lr=st.booleans(), accum=st.integers(1, 2))
def test_state_after_k_consumed_steps_resumes_at_step_k_with_workers(resume_index, data, with_lr, accum):
    # a state_dict taken with num_workers=2 and no LR wrapper resumes where the loop is, not where prefetch is
    dataset = SourceDataset(resume_index, columns=["text"])
    def make():
        return PackedBatchSampler(resume_index, rank=1, world_size=2, grad_accum=accum,
                                          order="shuffle", seed=5)
    whole = _train(resume_index, dataset, make(), lr=with_lr)
    steps = len(whole) // accum
    k = data.draw(st.integers(0, steps - 1))
    first = make()
    head = _train(resume_index, dataset, first, steps=k, lr=with_lr) if k else []
    second = make()
    second.load_state_dict(first.state_dict())
    second.set_epoch(0)
    assert head + _train(resume_index, dataset, second, lr=with_lr) == whole


@pytest.mark.slow
def test_example_trains_with_two_gloo_ranks(text_index, tmp_path):
    _, index = text_index
    outs = run_gloo_ranks([ROOT / "examples" / "train_tiny.py", index, "--steps", "3", "--grad-accum", "2"],
                          timeout=180)
    for r, out in enumerate(outs):
        lines = [line for line in out.splitlines() if line.startswith(f"rank {r} step")]
        assert len(lines) == 3, out
        assert all("batch shapes" in line and "tokens" in line and "lr" in line for line in lines)
    lrs = [[line.split(" lr ")[1].split()[0] for line in out.splitlines() if " lr " in line] for out in outs]
    assert lrs[0] == lrs[1]  # every rank steps with the same LR


@pytest.mark.slow
@pytest.mark.parametrize("site", ["installed", "venv inside a sortpack clone"])
def test_sortpack_torch_never_shadows_torch(tmp_path, site):
    # with sortpack/ itself on sys.path (python sortpack/x.py), `import torch` must be PyTorch, wherever
    # PyTorch is installed: a .venv inside the clone puts "sortpack" in torch's own path
    import torch as real

    paths = [str(ROOT)]
    if site != "installed":
        venv = tmp_path / "sortpack" / ".venv" / "site-packages"
        venv.mkdir(parents=True)
        (venv / "torch").symlink_to(Path(real.__file__).parent, target_is_directory=True)
        paths.insert(0, str(venv))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import torch; "
            "assert hasattr(torch, 'tensor') and hasattr(torch.optim, 'SGD'), torch.__file__; "
            "import sortpack.torch as face, sortpack.train.lr as lr; "
            "assert face.PackedBatchSampler and lr.VariableBatchSizeLR; print(torch.__file__)")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "sortpack")], check=False, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    loaded = Path(out.stdout.strip().splitlines()[-1])
    # the real torch/__init__.py, not sortpack/torch.py: compared as files, not as strings
    assert loaded.name == "__init__.py" and loaded.parent.name == "torch", loaded
    assert not loaded.resolve().is_relative_to((ROOT / "sortpack").resolve()), loaded
    if site != "installed":
        assert loaded.parent == tmp_path / "sortpack" / ".venv" / "site-packages" / "torch"
