"""Packed documents equal unpacked: per-token losses and gradients of a packed micro-batch equal each document alone.

Two models, fp32: a tiny Hugging Face ``LlamaForCausalLM`` built from a config (SDPA, which
finds the documents from the restarting ``position_ids``) fed with ``hf_inputs``, and the
recipes' ``TinyLM`` (learned positions) under the flex recipe's document mask. Batches come
from ``varlen_collate`` over a ``--rows`` index the real pipeline wrote, and from a padded
index laid out flat.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torch.nn.functional as F

from sortpack.reader import PackedIndex
from sortpack.torch import PackedBatchSampler, PackedDataset, hf_inputs, varlen_collate

from reader_fixtures import pipeline_index
from support import ROOT

pytestmark = pytest.mark.torch
VOCAB = 64
TOL = {"rtol": 1e-5, "atol": 1e-5}


def per_token(logits, labels):
    """Return next-token losses (0 without a target) for labels aligned to the inputs, as HF shifts them."""
    targets = F.pad(labels[..., 1:], (0, 1), value=-100)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none",
                           ignore_index=-100).view(targets.shape)


def llama():
    """Return a tiny Llama (2 layers, GQA, RoPE) in fp32 with SDPA attention, no download."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).float()


def samples(n: int, seed: int = 1) -> tuple[np.ndarray, dict]:
    sizes = np.random.default_rng(seed).integers(1, 40, size=n)
    return sizes, {i: np.random.default_rng(100 + i).integers(1, VOCAB, int(k)) for i, k in enumerate(sizes)}


def doc_spans(batch) -> list[tuple[int, int, int]]:
    """Return (sample id, start, end) of every document in the flat layout."""
    cu, ids = batch["cu_seqlens"].tolist(), batch["sample_ids"].tolist()
    return [(ids[j], a, b) for j, a, b in zip(batch["seq_index"].tolist(), cu, cu[1:]) if j >= 0]


def check_parity(batch, docs, packed_fn, alone_fn, model):
    """Assert per-token losses and gradients of the packed batch equal each document run alone."""
    model.zero_grad()
    packed = packed_fn(batch).reshape(-1)  # flat, in the collate's layout
    packed.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0
    for j, a, b in doc_spans(batch):
        alone = alone_fn(torch.as_tensor(docs[j])[None])[0]
        torch.testing.assert_close(packed[a:b], alone, **TOL)
        total = total + alone.sum()
    total.backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, **TOL)
    assert int((batch["labels"] != -100).sum()) == sum(len(docs[j]) - 1 for j, _, _ in doc_spans(batch))


def hf_alone(model):
    def run(ids):
        labels = ids.clone()
        labels[:, 0] = -100
        return per_token(model(input_ids=ids, use_cache=False).logits, labels)
    return run


@pytest.fixture(scope="module")
def rows_index(tmp_path_factory):
    sizes, docs = samples(80)
    path = pipeline_index(tmp_path_factory.mktemp("parity") / "rows", sizes, rows=96, rows_per_microbatch=2)
    return PackedIndex(path), docs


@pytest.mark.slow
@pytest.mark.parametrize("rows", [True, False], ids=["rows-layout", "flat-layout"])
def test_hugging_face_llama_packed_rows_equal_each_document_alone(rows_index, rows):
    ix, docs = rows_index
    model = llama()
    collate = varlen_collate()
    for mb in list(PackedBatchSampler(ix, rank=0, world_size=1))[:3]:
        batch = collate(PackedDataset(docs).__getitems__(mb))
        assert len(doc_spans(batch)) > 2  # several documents per row

        def packed(b):
            kw = hf_inputs(b, rows=rows)
            return per_token(model(**kw).logits, kw["labels"])
        check_parity(batch, docs, packed, hf_alone(model), model)


def test_hugging_face_keys_match_data_collator_with_flattening():
    from transformers import DataCollatorWithFlattening

    seqs = [[5, 6, 7], [8], [9, 10, 11, 12]]
    ours = varlen_collate(position_ids_start=2)(seqs)
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True,
                                        position_ids_start=2)([{"input_ids": s} for s in seqs])
    kw = hf_inputs(ours)
    assert kw.pop("use_cache") is False  # a KV cache turns off Hugging Face's packed-document detection
    for key in ("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(kw[key], theirs[key]), key
        assert kw[key].dtype == theirs[key].dtype, key
    assert kw["max_length_q"] == kw["max_length_k"] == theirs["max_length_q"] == 4


@pytest.mark.slow
def test_recipe_model_under_the_document_mask_equals_each_document_alone(rows_index):
    sys.path.insert(0, str(ROOT / "examples" / "recipes"))
    from common import TinyLM, sdpa_padded, token_losses
    from flex_rows import document_ids, document_mask
    from torch.nn.attention.flex_attention import create_mask

    ix, docs = rows_index
    docs = {i: d % 256 for i, d in docs.items()}
    torch.manual_seed(0)
    model = TinyLM(max_len=96)
    collate = varlen_collate()
    for mb in list(PackedBatchSampler(ix, rank=0, world_size=1))[:3]:
        batch = collate(PackedDataset(docs).__getitems__(mb))
        width = int(mb.padded_size)

        def packed(b, width=width):
            rows = b["input_ids"].numel() // width
            ids, positions, labels = (b[k].view(rows, width) for k in ("input_ids", "position_ids", "labels"))
            dense = create_mask(document_mask(document_ids(b, width)), rows, 1, width, width, device="cpu")

            def attend(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
            return token_losses(model(ids, positions, attend), labels)

        def alone(ids):
            labels = ids.clone()
            labels[:, 0] = -100
            pad = torch.zeros_like(ids, dtype=torch.bool)
            return token_losses(model(ids, torch.arange(ids.shape[1])[None], sdpa_padded(pad)), labels).view(ids.shape)
        check_parity(batch, docs, packed, alone, model)


def test_per_document_padding_for_context_parallelism():
    seqs = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    out = varlen_collate(pad_id=0, pad_to_multiple=4)(seqs)  # CP = 2: each document a multiple of 2 x CP
    assert out["input_ids"].tolist() == [1, 2, 3, 0, 4, 0, 0, 0, 5, 6, 7, 8, 9, 0, 0, 0]
    assert out["cu_seqlens_padded"].tolist() == out["cu_seq_lens_q"].tolist() == [0, 4, 8, 16]
    assert out["cu_seqlens"].tolist() == [0, 3, 4, 9]  # real tokens (Transformer Engine's THD convention)
    assert out["labels"].tolist() == [-100, 2, 3, -100, -100, -100, -100, -100, -100, 6, 7, 8, 9, -100, -100, -100]
    assert out["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]
    assert out["lengths"].tolist() == [3, 1, 5] and out["max_seqlen"] == 5 and out["max_length_q"] == 8
    assert out["token_mask"].sum() == 9


def test_rows_position_ids_restart_per_document_from_a_chosen_start(rows_index):
    ix, docs = rows_index
    mb = next(iter(PackedBatchSampler(ix, rank=0, world_size=1)))
    out = varlen_collate(position_ids_start=2)(PackedDataset(docs).__getitems__(mb))
    cu = out["cu_seqlens"].tolist()
    pos, labels, ids = out["position_ids"].tolist(), out["labels"].tolist(), out["input_ids"].tolist()
    for j, a, b in zip(out["seq_index"].tolist(), cu, cu[1:]):
        assert pos[a:b] == list(range(2, 2 + b - a))
        assert labels[a:b] == ([-100] + ids[a + 1:b] if j >= 0 else [-100] * (b - a))
    assert out["row_shape"] == (mb.batch_size, mb.padded_size)
