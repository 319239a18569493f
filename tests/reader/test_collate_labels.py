"""Fine-tuning labels travel with the tokens: stored beside them, laid out by the collates as the ids are."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from sortpack.inputs.finetune import IGNORE_INDEX, encode_chats, fine_tune_shape, load_chat_template
from sortpack.inputs.specs import load_tokenizer
from sortpack.reader import PackedIndex, Samples, SourceDataset
from sortpack.torch import PackedBatchSampler, hf_inputs, pad_collate, varlen_collate

from support import assert_same_at_ranks, conversations, make_chat_tokenizer, read_manifest, run_sortpack

SMALL = {"SORTPACK_TEST_DATA_ROWS": "64"}  # several data shards


def _expected(ids: list[int], labels: list[int]) -> list[int]:
    """Return the labels a collate gives a document: its own, with no target at its first position."""
    return [IGNORE_INDEX] + list(labels[1:]) if ids else []


@pytest.fixture(params=["c", "numpy"])
def backend(request, monkeypatch):
    """Run the test with the compiled kernels and with the numpy fallback."""
    from sortpack.kernels import _loader

    if request.param == "numpy":
        monkeypatch.setattr(_loader, "_clib", None)
        monkeypatch.setattr(_loader, "_warned", True)
    elif _loader.backend() != "c":
        pytest.skip("the compiled kernels are not built")
    return request.param


def test_items_labels_are_laid_out_as_their_ids(backend):
    items = [{"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]}, {"input_ids": [5, 6], "labels": [5, 6]},
             {"input_ids": [7, 8, 9], "labels": [-100, -100, -100]}]
    pad = pad_collate(key="input_ids")(items)
    assert pad["labels"].tolist() == [[-100, -100, 3, 4], [-100, 6, -100, -100], [-100, -100, -100, -100]]
    var = varlen_collate(key="input_ids")(items)
    assert var["labels"].tolist() == [-100, -100, 3, 4, -100, 6, -100, -100, -100]
    cp = varlen_collate(key="input_ids", pad_to_multiple=4)(items)
    assert cp["labels"].tolist() == [-100, -100, 3, 4, -100, 6, -100, -100, -100, -100, -100, -100]
    # labels=None: the labels derived from the ids, as before
    assert pad_collate(key="input_ids", labels=None)(items)["labels"][1].tolist() == [-100, 6, -100, -100]
    assert varlen_collate(key="input_ids", labels=None)(items)["labels"][-3:].tolist() == [-100, 8, 9]
    # tokenize= giving (ids, labels)
    var2 = varlen_collate(tokenize=lambda it: (it["input_ids"], it["labels"]))(items)
    assert torch.equal(var2["labels"], var["labels"])
    with pytest.raises(ValueError, match="item 1 has 1 labels for 2 token ids"):
        pad_collate(key="input_ids")([items[0], {"input_ids": [5, 6], "labels": [5]}])


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    base = tmp_path_factory.mktemp("chats")
    tokenizer, config = make_chat_tokenizer(base / "tok")
    chats = conversations(240, seed=7)
    with open(base / "chats.jsonl", "w") as f:
        for i, chat in enumerate(chats):
            f.write(json.dumps({"messages": chat, "n": i}) + "\n")
    enc = encode_chats(load_tokenizer(tokenizer), load_chat_template(config), chats)
    return base, tokenizer, config, enc.ids.to_pylist(), enc.labels.to_pylist()


def _chat_args(chat_data, *extra) -> list:
    base, tokenizer, config, _, _ = chat_data
    return ["run", base / "chats.jsonl", "--chat-template", config, "--tokenizer", tokenizer, "--quiet", *extra]


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--max-tokens", "600", "--budget", "tokens"], ["--rows", "400"]])
def test_stored_chat_labels_reach_every_collate(chat_data, tmp_path, layout, backend):
    _, tokenizer, config, ids, labels = chat_data
    out = tmp_path / "plan"
    run_sortpack([*_chat_args(chat_data, "--store-tokens", *layout), "-o", out], env=SMALL)
    data = read_manifest(out)["data"]
    assert data["columns"] == ["input_ids", "labels"] and data["tokens"]["labels"] == "labels"
    ds = SourceDataset(out)
    shape = fine_tune_shape("messages", chat_template=config, tokenizer=load_tokenizer(tokenizer))
    unstored = SourceDataset(out, columns=["messages"])  # the plan's rows from the JSONL, tokenized per item
    seen = 0
    for mb in PackedBatchSampler(PackedIndex(out), rank=0, world_size=1):
        items = ds.__getitems__(mb)
        want = [_expected(ids[i], labels[i]) for i in mb]
        var = varlen_collate(key="input_ids")(items)
        bounds = var["cu_seqlens"].tolist()
        segs = [var["labels"][a:b].tolist() for a, b in zip(bounds, bounds[1:])]
        docs = [s for s, k in zip(segs, var["seq_index"].tolist()) if k >= 0]
        assert docs == want
        assert all(set(s) == {IGNORE_INDEX} for s, k in zip(segs, var["seq_index"].tolist()) if k < 0)
        raw = unstored.__getitems__(mb)
        checks = [(var, varlen_collate(tokenize=shape))]
        if "--rows" in layout:  # rows are laid out by varlen_collate; pad_collate refuses them (one line)
            with pytest.raises(ValueError, match=r"packed rows of 400 positions \(a --rows plan\).*varlen_collate"):
                pad_collate(key="input_ids")(items)
        else:
            pad = pad_collate(key="input_ids")(items)
            for r, w in enumerate(want):
                assert pad["labels"][r, :len(w)].tolist() == w and set(pad["labels"][r, len(w):].tolist()) <= {-100}
            checks.append((pad, pad_collate(tokenize=shape)))
        for stored, collate in checks:
            fast, slow = stored, collate(raw)
            assert torch.equal(fast["labels"], slow["labels"]) and torch.equal(fast["input_ids"], slow["input_ids"])
        seen += len(mb)
    assert seen == len(ids)


@pytest.mark.slow
def test_hf_inputs_feed_the_labels_to_a_model(chat_data, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "plan"
    run_sortpack([*_chat_args(chat_data, "--store-tokens", "--max-tokens", "600", "--budget", "tokens"), "-o", out])
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(config).eval()
    ds = SourceDataset(out)
    mb = next(iter(PackedBatchSampler(PackedIndex(out), rank=0, world_size=1)))
    batch = varlen_collate(key="input_ids")(ds.__getitems__(mb))
    kwargs = hf_inputs(batch)
    with torch.no_grad():
        got = model(**kwargs).loss
        logits = model(**{k: v for k, v in kwargs.items() if k != "labels"}).logits[0]
    labels = batch["labels"]
    target = torch.cat([labels[1:], torch.tensor([IGNORE_INDEX])])  # the next token's label, as the model shifts
    keep = target != IGNORE_INDEX
    want = torch.nn.functional.cross_entropy(logits[keep], target[keep])
    assert int(keep.sum()) > 0 and torch.allclose(got, want, atol=1e-5)


def test_labels_column_stored_with_store(tmp_path, backend):
    rng = np.random.default_rng(1)
    n = 200
    lengths = rng.integers(2, 60, n)
    ids = [rng.integers(0, 1000, k).tolist() for k in lengths]
    labels = [[t if j >= k // 2 else IGNORE_INDEX for j, t in enumerate(x)] for x, k in zip(ids, lengths)]
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), tmp_path / "d.parquet", row_group_size=50)
    out = tmp_path / "plan"
    run_sortpack(["run", tmp_path / "d.parquet", "-o", out, "--labels-column", "labels", "--max-tokens", "256",
                  "--budget", "tokens", "--store", "input_ids,labels", "--quiet"])
    assert read_manifest(out)["options"]["fine_tune"] == {"shape": "labels", "labels_column": "labels"}
    ds = SourceDataset(out)
    for mb in PackedBatchSampler(PackedIndex(out), rank=0, world_size=1):
        var = varlen_collate(key="input_ids")(ds.__getitems__(mb))
        assert var["labels"].tolist() == [t for i in mb for t in _expected(ids[i], labels[i])]
        rows = Samples([{"input_ids": ids[i], "labels": labels[i]} for i in mb], mb)
        assert torch.equal(pad_collate(key="input_ids")(rows)["labels"],
                           pad_collate(key="input_ids")(ds.__getitems__(mb))["labels"])


def test_store_tokens_refuses_a_labels_column(tmp_path):
    pq.write_table(pa.table({"input_ids": [[1, 2]], "labels": [[-100, 2]]}), tmp_path / "d.parquet")
    proc = run_sortpack(["run", tmp_path / "d.parquet", "-o", tmp_path / "p", "--labels-column", "labels",
                         "--max-tokens", "8", "--store-tokens"], check=False)
    assert proc.returncode == 2 and "--store input_ids,labels" in proc.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.mpi
@pytest.mark.slow
def test_stored_chat_plan_is_the_same_at_any_rank_count(chat_data, tmp_path):
    assert_same_at_ranks(_chat_args(chat_data, "--store-tokens", "--rows", "400"), tmp_path, env=SMALL)


@pytest.mark.slow
def test_packed_rows_give_each_conversations_own_losses_and_gradients(chat_data, tmp_path):
    """Packed rows with masked labels: per-token losses and gradients equal each conversation's alone (float64)."""
    transformers = pytest.importorskip("transformers")
    _, _, _, ids, labels = chat_data
    out = tmp_path / "plan"
    run_sortpack([*_chat_args(chat_data, "--store-tokens", "--rows", "400", "--rows-per-microbatch", "2"),
                  "-o", out])
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                                      attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).double()
    index = PackedIndex(out)
    mb = max(PackedBatchSampler(index, rank=0, world_size=1), key=len)  # the micro-batch of most conversations
    batch = varlen_collate(key="input_ids")(SourceDataset(out).__getitems__(mb))
    inputs = hf_inputs(batch, rows=True)
    packed_labels = inputs.pop("labels")

    def losses(logits, lab):
        target = torch.nn.functional.pad(lab[:, 1:], (0, 1), value=IGNORE_INDEX)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none",
                                                 ignore_index=IGNORE_INDEX)

    packed = losses(model(**inputs).logits, packed_labels)
    packed.sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    bounds = batch["cu_seqlens"].tolist()
    alone = []
    for (a, b), k in zip(zip(bounds, bounds[1:]), batch["seq_index"].tolist()):
        if k < 0:
            continue  # a row's padding
        i = mb[k]
        x = torch.tensor([ids[i]])
        lab = torch.tensor([_expected(ids[i], labels[i])])
        mine = losses(model(input_ids=x, use_cache=False).logits, lab)
        assert torch.allclose(packed[a:b], mine, atol=1e-10, rtol=0), f"conversation {i}"
        alone.append(mine)
    assert len(alone) == len(mb) >= 2
    torch.cat(alone).sum().backward()
    for p, g in zip(model.parameters(), packed_grads):
        assert torch.allclose(p.grad, g, atol=1e-10, rtol=1e-8)


def test_pad_collate_refuses_a_rows_micro_batch_in_one_line():
    # a --rows micro-batch padded document by document would be (documents, row length): a silent memory blow-up
    from sortpack.reader import MicroBatch

    mb = MicroBatch([4, 7, 9], microbatch=12, batch_size=2, padded_size=8, row_splits=[0, 2, 3])
    items = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]

    class Rows(list):
        microbatch = mb

    with pytest.raises(ValueError, match=r"^pad_collate: micro-batch 12 is 2 packed rows of 8 positions \(a --rows "
                                         r"plan\), .*use varlen_collate \(its rows: hf_inputs\(batch, rows=True\)\)$"):
        pad_collate()(Rows(items))
    batch = hf_inputs(varlen_collate()(Rows(items)), rows=True)
    assert tuple(batch["input_ids"].shape) == (2, 8)
