"""What attention kernels need from a packed batch: per-token source ids and flex_attention's block metadata.

The block metadata the collates compute from the plan's boundaries is held element for
element against ``torch.nn.attention.flex_attention.create_block_mask`` of the same causal
document mask (the oracle), on rows the real pipeline packed.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sortpack.reader import PackedIndex  # noqa: E402
from sortpack.reader.flex_blocks import BLOCK_KEYS, document_blocks, row_cu  # noqa: E402
from sortpack.torch import (  # noqa: E402
    MicroBatch,
    PackedBatchSampler,
    PackedDataset,
    SourceDataset,
    block_mask,
    pad_collate,
    varlen_collate,
)

from reader_fixtures import pipeline_index  # noqa: E402
from support import lognormal, run_sortpack, write_text_parquet  # noqa: E402

ROW = 512


def oracle(doc: np.ndarray, block: int):
    """Return ``create_block_mask`` of the causal document mask over document ids ``doc`` (rows, L), on the CPU."""
    d = torch.from_numpy(np.ascontiguousarray(doc))

    def mask_mod(b, h, q, kv):
        return (d[b, q] == d[b, kv]) & (q >= kv)

    rows, width = doc.shape
    return flex.create_block_mask(mask_mod, rows, None, width, width, device="cpu", BLOCK_SIZE=block)


def assert_same_blocks(got: dict, ref) -> None:
    """Assert every block tensor of a collate batch equals the ``BlockMask``'s: shape, dtype and each element."""
    for k in BLOCK_KEYS:
        want = getattr(ref, k)
        assert got[k].dtype == want.dtype == torch.int32, k
        assert got[k].shape == want.shape and torch.equal(got[k], want), k


def row_documents(batch: dict) -> np.ndarray:
    """Return the (rows, L) document id of each position of a rows-mode varlen batch (its segment)."""
    return batch["seq_idx"].numpy().reshape(batch["row_shape"])


@pytest.fixture(scope="module")
def rows_plan(tmp_path_factory):
    """A --rows 512 plan of 600 texts (log-normal lengths up to 512): about 200 packed rows."""
    return pipeline_index(tmp_path_factory.mktemp("flexrows") / "plan", lognormal(600, 3, ROW), rows=ROW,
                          rows_per_microbatch=4)


def ids_of(lengths: np.ndarray) -> dict:
    """Return token ids per sample id (sample i: ``lengths[i]`` ids)."""
    return {i: np.arange(1, int(n) + 1, dtype=np.int64) for i, n in enumerate(lengths)}


def test_varlen_rows_metadata_equals_create_block_mask(rows_plan):
    block = 32
    collate = varlen_collate(flex_block_size=block)
    dataset = PackedDataset(_Encoded(SourceDataset(rows_plan, columns=["text"])))
    for mb in list(PackedBatchSampler(PackedIndex(rows_plan), rank=0, world_size=1))[:3]:
        batch = collate(dataset.__getitems__(mb))
        assert batch["block_size"] == block and batch["row_shape"] == (mb.batch_size, ROW)
        assert_same_blocks(batch, oracle(row_documents(batch), block))


class _Encoded:
    """A dataset of a plan's texts as their UTF-8 bytes (token ids of the plan's ``length`` sizes)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __getitem__(self, i):
        return np.frombuffer(self.dataset[i]["text"].encode(), dtype=np.uint8).astype(np.int64)

    def __len__(self):
        return len(self.dataset)


def test_varlen_one_row_and_padded_documents_equal_create_block_mask():
    lengths = np.array([5, 1, 40, 17, 3])
    items = PackedDataset(ids_of(lengths)).__getitems__(MicroBatch(range(5)))
    for k in (None, 8):
        batch = varlen_collate(pad_to_multiple=k, flex_block_size=16)(items)
        doc = batch["seq_idx"].numpy()[None]  # no rows: one row of every token
        assert_same_blocks(batch, oracle(doc, 16))
    assert batch["kv_indices"].shape == (1, 1, 6, 6)  # 5 documents padded to 8: 88 tokens, 6 tiles of 16


def test_pad_collate_metadata_is_each_sample_then_its_padding(rows_plan):
    lengths = np.array([30, 64, 1, 0, 50])
    mb = MicroBatch(range(4), batch_size=5, padded_size=64)  # a padding slot: a row of padding only
    batch = pad_collate(flex_block_size=16)(PackedDataset(ids_of(lengths)).__getitems__(mb))
    doc = (np.arange(64)[None, :] >= batch["lengths"].numpy()[:, None]).astype(np.int64)
    assert_same_blocks(batch, oracle(doc, 16))


def test_block_mask_gives_flex_attention_the_document_mask(rows_plan):
    collate = varlen_collate(flex_block_size=128)
    mb = next(iter(PackedBatchSampler(PackedIndex(rows_plan), rank=0, world_size=1)))
    batch = collate(PackedDataset(_Encoded(SourceDataset(rows_plan, columns=["text"]))).__getitems__(mb))
    mask = block_mask(batch)
    ref = oracle(row_documents(batch), 128)
    for k in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
              "full_q_num_blocks", "full_q_indices"):
        assert torch.equal(getattr(mask, k), getattr(ref, k)), k
    rows, width = batch["row_shape"]
    q, k, v = (torch.randn(rows, 2, width, 8, generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3))
    torch.testing.assert_close(flex.flex_attention(q, k, v, block_mask=mask), flex.flex_attention(q, k, v,
                                                                                                   block_mask=ref))
    dense = flex.create_mask(mask.mask_mod, rows, 1, width, width, device="cpu")
    torch.testing.assert_close(flex.flex_attention(q, k, v, block_mask=mask),
                               torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense))


def test_a_block_size_must_be_a_positive_integer():
    for bad in (0, -16, 1.5, True, "128"):
        with pytest.raises(ValueError, match="flex_block_size must be a positive integer"):
            varlen_collate(flex_block_size=bad)
        with pytest.raises(ValueError, match="flex_block_size must be a positive integer"):
            pad_collate(flex_block_size=bad)
    with pytest.raises(ValueError, match="no block metadata"):
        block_mask({"input_ids": torch.zeros(3)})


@st.composite
def packed_rows(draw):
    """Return (cu, rows, width, block): random documents packed end to end into rows."""
    rows = draw(st.integers(1, 3))
    width = draw(st.integers(1, 200))
    block = draw(st.sampled_from([1, 2, 3, 7, 16, 64, 128]))
    cuts = [np.unique([0, width, *draw(st.lists(st.integers(0, width), max_size=8))])[:-1] + r * width
            for r in range(rows)]
    return np.concatenate([*cuts, [rows * width]]), rows, width, block


@pytest.mark.slow
@settings(deadline=None)  # create_block_mask's first call traces its vmap: seconds
@given(packed_rows())
def test_document_blocks_equal_create_block_mask_for_any_documents(case):
    cu, rows, width, block = case
    doc = np.searchsorted(cu, np.arange(rows * width), side="right").reshape(rows, width)
    ref = oracle(doc, block)
    got = document_blocks(cu, rows, width, block)
    for k in BLOCK_KEYS:
        want = getattr(ref, k).numpy()
        assert getattr(got, k).dtype == want.dtype and np.array_equal(getattr(got, k), want), k


def test_row_bounds_of_a_padded_batch():
    assert row_cu(np.array([3, 0, 8, 9]), 8).tolist() == [0, 3, 8, 16, 24, 32]


@pytest.mark.slow
def test_a_thousand_packed_rows_equal_create_block_mask(tmp_path):
    lengths = lognormal(3000, 11, 512)
    plan = pipeline_index(tmp_path / "plan", lengths, rows=512, rows_per_microbatch=25)
    seqs, collate = ids_of(lengths), varlen_collate(flex_block_size=64)
    rows = 0
    for mb in PackedBatchSampler(PackedIndex(plan), rank=0, world_size=1):
        batch = collate(PackedDataset(seqs).__getitems__(mb))
        assert_same_blocks(batch, oracle(row_documents(batch), 64))
        rows += batch["row_shape"][0]
    assert rows >= 1000


def test_source_ids_are_the_microbatch_source_at_every_real_token():
    lengths = np.array([4, 7, 2])
    mb = MicroBatch(range(3), batch_size=3, padded_size=12, row_splits=[0, 2, 3], source="code", source_id=2)
    items = PackedDataset(ids_of(lengths)).__getitems__(mb)
    varlen = varlen_collate(source_ids=True)(items)
    assert varlen["source_ids"].dtype == torch.int64
    assert torch.equal(varlen["source_ids"], torch.where(varlen["token_mask"], 2, -1))
    assert varlen["source_ids"].tolist().count(-1) == 24 - 13  # two rows of 12: the padding tails
    # pad_collate pads a micro-batch of samples (a --rows micro-batch is refused: varlen_collate lays rows out)
    flat = MicroBatch(range(3), batch_size=3, padded_size=12, source="code", source_id=2)
    padded = pad_collate(source_ids=True)(PackedDataset(ids_of(lengths)).__getitems__(flat))
    assert torch.equal(padded["source_ids"], torch.where(padded["key_padding_mask"], -1, 2))
    with pytest.raises(ValueError, match="mixture plan"):
        varlen_collate(source_ids=True)(PackedDataset(ids_of(lengths)).__getitems__(MicroBatch(range(3))))
    with pytest.raises(ValueError, match="mixture plan"):
        pad_collate(source_ids=True)([np.arange(3)])


@pytest.mark.slow
def test_source_ids_of_a_mixture_plan_name_the_manifest_source(tmp_path):
    for name, seed in (("web", 1), ("code", 2), ("books", 3)):
        (tmp_path / name).mkdir()
        write_text_parquet(tmp_path / name / "a.parquet", lognormal(150, seed, 900), 50)
    spec = {"sources": [{"name": n, "inputs": [n], "weight": w} for n, w in (("web", 5), ("code", 3), ("books", 2))],
            "seed": 1}
    (tmp_path / "mix.json").write_text(json.dumps(spec))
    run_sortpack(["run", "--mixture", tmp_path / "mix.json", "-o", tmp_path / "plan", "--rows", "1024", "--store",
                  "text"])
    index = PackedIndex(tmp_path / "plan")
    names = [s["name"] for s in index.manifest["mixture"]["sources"]]
    dataset = _Encoded(SourceDataset(tmp_path / "plan", columns=["text"]))
    seen = set()
    for mb in PackedBatchSampler(index, rank=0, world_size=1):
        want = int(index["source"][mb.microbatch])
        assert mb.source_id == want and names[want] == mb.source
        batch = varlen_collate(source_ids=True, flex_block_size=64)(PackedDataset(dataset).__getitems__(mb))
        real = batch["token_mask"]
        assert (batch["source_ids"][real] == want).all() and (batch["source_ids"][~real] == -1).all()
        seen.add(want)
    assert seen == {0, 1, 2}
