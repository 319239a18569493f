"""Stored token ids go from the Arrow buffers into the batch: the micro-batch's tokens only, no rows built."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
from sortpack.reader import PackedIndex, PackedSampler, SourceDataset
from sortpack.reader.lazy_rows import TableSamples
from sortpack.reader.tokens import ragged_tokens
from sortpack.torch import PackedBatchSampler, pad_collate, varlen_collate

from support import make_tokenizer, run_sortpack

SMALL = {"SORTPACK_TEST_DATA_ROWS": "70"}  # small data shards


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    base = tmp_path_factory.mktemp("stored")
    rng = np.random.default_rng(3)
    words = np.array(["hello", "world", "the", "quick", "brown", "fox"])
    texts = [" ".join(words[rng.integers(0, len(words), rng.integers(1, 50))]) for _ in range(400)]
    pq.write_table(pa.table({"text": texts, "raw": [t.encode() for t in texts]}), base / "d.parquet",
                   row_group_size=100)
    tok = make_tokenizer(base / "tok.json")
    out = base / "plan"
    run_sortpack(["run", base / "d.parquet", "-o", out, "--column", "text", "--size", "tokens", "--tokenizer", tok,
                  "--max-tokens", "300", "--store", "raw", "--store-tokens", "--quiet"], env=SMALL)
    return out


def test_collate_reads_only_the_microbatch_and_builds_no_rows(plan):
    ds = SourceDataset(plan)
    for mb in PackedBatchSampler(PackedIndex(plan), rank=0, world_size=1, order="shuffle", seed=1):
        items = ds.__getitems__(mb)
        values, offsets = ragged_tokens(items, key="input_ids")
        pad, var = pad_collate(key="input_ids")(items), varlen_collate(key="input_ids")(items)
        assert items.built is False  # no Python row per sample was made
        want = [row["input_ids"] for row in items]  # builds the rows now, for the check
        assert len(values) == sum(len(w) for w in want) == int(var["cu_seqlens"][-1])
        assert [values[a:b].tolist() for a, b in zip(offsets, offsets[1:])] == want
        for r, w in enumerate(want):
            assert pad["input_ids"][r, :len(w)].tolist() == w and pad["lengths"][r] == len(w)
            assert pad["labels"][r, 0] == -100 and pad["labels"][r, 1:len(w)].tolist() == w[1:]
        raw_values, raw_offsets = ragged_tokens(items, key="raw")  # a stored binary column: its bytes
        assert [bytes(raw_values[a:b].astype(np.uint8)) for a, b in zip(raw_offsets, raw_offsets[1:])] == \
            [row["raw"] for row in items]
    # ids from all over the plan (rows of several data shards), read as a table of several chunks:
    # take() returns one contiguous copy, but a user's dataset may hand collate any chunking
    ids = PackedIndex(plan).all_sample_ids()[::7].tolist()
    table = ds.__getitems__(ids).table
    third = table.num_rows // 3
    items = TableSamples(pa.concat_tables([table.slice(0, third), table.slice(third, third), table.slice(2 * third)]))
    assert items.table.column("input_ids").num_chunks == 3
    values, offsets = ragged_tokens(items, key="input_ids")
    assert [values[a:b].tolist() for a, b in zip(offsets, offsets[1:])] == table.column("input_ids").to_pylist()


def test_stored_samples_still_read_as_rows(plan):
    ds = SourceDataset(plan, columns=["raw"], transform=lambda row: len(row["raw"]))
    mb = next(iter(PackedBatchSampler(PackedIndex(plan), rank=0, world_size=1)))
    items = ds.__getitems__(mb)
    assert len(items) == len(mb) and items.microbatch is mb and items.built is False
    assert list(items) == [len(r) for r in ds.stored.microbatch(mb.microbatch).column("raw").to_pylist()]
    assert items[0] == list(items)[0] and bool(items)


def _same_batch(fast: dict, slow: dict) -> None:
    assert fast.keys() == slow.keys()
    for k, v in slow.items():
        if isinstance(v, torch.Tensor):
            assert fast[k].dtype == v.dtype and torch.equal(fast[k], v), k
        else:
            assert fast[k] == v, k


@pytest.mark.parametrize("skip", [False, True])
def test_stored_views_give_the_batches_of_the_row_path(plan, skip):
    """The zero-copy path (stored ids read in place, one compiled pass) equals collating the rows as dicts."""
    from sortpack.reader import Samples
    from sortpack.reader.tokens import stored_token_view

    index = PackedIndex(plan)
    skips = index.all_sample_ids()[::5].tolist() if skip else None  # micro-batches that lose samples: take()
    ds = SourceDataset(plan)
    sampler = PackedBatchSampler(index, rank=0, world_size=1, order="shuffle", seed=2)
    if skips:
        sampler = PackedSampler(index, rank=0, world_size=1, order="shuffle", seed=2, skip_samples=skips)
    collates = [pad_collate(key="input_ids"), varlen_collate(key="input_ids"), pad_collate(key="input_ids", pad_id=3),
                varlen_collate(key="input_ids", pad_to_multiple=4, position_ids_start=2)]
    seen = 0
    for mb in sampler:
        items = ds.__getitems__(mb)
        view = stored_token_view(items, "input_ids")
        assert view is not None and not view[0].flags.owndata  # read in place, not copied
        if not skip:
            assert items.sample_ids is not None and items.sample_ids.tolist() == list(mb)
        rows = Samples([{"input_ids": r["input_ids"]} for r in items.table.to_pylist()], mb)
        for collate in collates:
            fast, slow = collate(items), collate(rows)
            _same_batch(fast, slow)
            assert fast["sample_ids"][:len(mb)].tolist() == list(mb)
        seen += 1
    assert seen == len(index) or skip


@pytest.mark.parametrize("order", ["index", "shuffle"])
def test_the_compiled_collate_gives_the_numpy_fallbacks_batches(plan, order, monkeypatch):
    """Every collate helper's compiled path (one kernel call into torch's tensors) equals the numpy fallback's batch."""
    from sortpack.kernels import _loader

    if _loader.backend() != "c":
        pytest.skip("the compiled kernels are not built")
    from sortpack.reader import MicroBatch, Samples

    ds = SourceDataset(plan)
    collates = [pad_collate(key="input_ids"), pad_collate(key="input_ids", pad_id=3, attn_mask="causal"),
                pad_collate(key="input_ids", pad_to_multiple=8), varlen_collate(key="input_ids"),
                varlen_collate(key="input_ids", position_ids_start=2),
                varlen_collate(key="input_ids", pad_to_multiple=4)]
    batches = []
    for mb in PackedSampler(PackedIndex(plan), rank=1, world_size=2, grad_accum=2, order=order, seed=4):
        items = ds.__getitems__(mb)
        rows = Samples([{"input_ids": r["input_ids"]} for r in items.table.to_pylist()], mb)
        cut = Samples(rows, MicroBatch(list(mb), mb.microbatch, mb.batch_size, 5, facts=mb.facts, repeat=True))
        plain = Samples(rows[:3])  # no micro-batch: the items' own lengths, no sample ids
        batches.append([(c, x, c(x)) for c in collates for x in (items, rows, cut, plain)])
    assert any(mb.repeat for mb in PackedSampler(PackedIndex(plan), rank=1, world_size=2, grad_accum=2))
    monkeypatch.setattr(_loader, "_clib", None)
    monkeypatch.setattr(_loader, "_warned", True)
    for triples in batches:
        for collate, x, fast in triples:
            slow = collate(x)
            _same_batch(fast, slow)
            for k, v in fast.items():
                if isinstance(v, torch.Tensor):
                    assert v.is_contiguous(), k


def test_collates_make_cpu_tensors_whatever_torch_s_default_device(plan):
    """The kernels write into the batch's memory: a default device other than the CPU must not reach them."""
    ds = SourceDataset(plan)
    mb = next(iter(PackedBatchSampler(PackedIndex(plan), rank=0, world_size=1)))
    items = ds.__getitems__(mb)
    want = {c: c(items) for c in (pad_collate(key="input_ids"), varlen_collate(key="input_ids"))}
    torch.set_default_device("meta")  # a tensor without memory: what torch.empty would now make
    try:
        got = {c: c(items) for c in want}
    finally:
        torch.set_default_device("cpu")
    for c, batch in got.items():
        _same_batch(batch, want[c])
        assert all(v.device.type == "cpu" for v in batch.values() if isinstance(v, torch.Tensor))
