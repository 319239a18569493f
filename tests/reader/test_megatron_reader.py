"""A plan over Megatron datasets read at train time: each micro-batch's ids from the mapped .bin
(sortpack.reader.megatron through SourceDataset, the collates, PlanLoader and DataLoader workers)."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from sortpack.errors import SortpackError
from sortpack.reader import PackedIndex, PackedSampler, SourceDataset
from sortpack.reader.megatron import MegatronRows

from megatron_files import labels_for, plan_in_process, random_sequences, write_dataset

WEB = random_sequences(300, seed=11, vocab=60_000)
CODE = random_sequences(200, seed=12, vocab=1000)
ALL = WEB + CODE
LABELS = labels_for(ALL)


def _plan(path: Path, inputs: list[str], **opts) -> Path:
    """Run the real pipeline in process over Megatron ``inputs``; return the plan."""
    analyze = {k: opts.pop(k) for k in ("size", "labels_column") if k in opts}
    return plan_in_process(path, inputs, analyze, **opts)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two datasets (uint16 and int32) with their labels companions, and three plans over both."""
    root = tmp_path_factory.mktemp("megatron")
    inputs = [str(write_dataset(root / "web", WEB, np.uint16)), str(write_dataset(root / "code", CODE, np.int32))]
    write_dataset(root / "web_labels", LABELS[:300], np.int32)
    write_dataset(root / "code_labels", LABELS[300:], np.int16)
    plans = {"plain": _plan(root / "plain", inputs, max_tokens=600),
             "rows": _plan(root / "rows", inputs, max_tokens=512, rows=512, labels_column="{}_labels"),
             "split": _plan(root / "split", inputs, max_tokens=100, oversize="split", size="tokens")}
    return root, inputs, plans


def _expected(ids, ranges=None) -> list[list[int]]:
    if ranges is None:
        return [ALL[i].tolist() for i in ids]
    return [ALL[i][b:e].tolist() for i, b, e in zip(ids, *ranges)]


@pytest.mark.parametrize("name", ["plain", "rows", "split"])
def test_every_micro_batch_is_its_samples_ids(data, name):
    _, _, plans = data
    index = PackedIndex(plans[name])
    ds = SourceDataset(plans[name])
    assert isinstance(ds._megatron, MegatronRows) and ds.stored is None
    seen = 0
    for mb in PackedSampler(plans[name], rank=0, world_size=1):
        rows = ds.__getitems__(mb)
        ranges = index.piece_ranges(mb.microbatch)
        assert rows.table.column("input_ids").to_pylist() == _expected(list(mb), ranges)
        assert rows.table.schema.field("input_ids").type.value_type.bit_width == 32
        seen += len(mb)
    assert seen == index.num_samples


def test_labels_come_from_the_companion(data):
    _, _, plans = data
    ds = SourceDataset(plans["rows"])
    for mb in PackedSampler(plans["rows"], rank=0, world_size=1):
        rows = ds.__getitems__(mb)
        assert rows.table.column("labels").to_pylist() == [LABELS[i].tolist() for i in mb]
    assert SourceDataset(plans["rows"], columns=["input_ids"])[5].keys() == {"input_ids"}
    assert SourceDataset(plans["rows"])[5]["labels"] == LABELS[5].tolist()


def test_the_collates_read_the_gathered_ids(data):
    torch = pytest.importorskip("torch")
    from sortpack.torch import pad_collate, varlen_collate

    _, _, plans = data
    ds = SourceDataset(plans["rows"])
    mb = next(iter(PackedSampler(plans["rows"], rank=0, world_size=1)))
    var = varlen_collate(key="input_ids")(ds.__getitems__(mb))
    real = var["token_mask"]  # the packed row's tokens, not its padding to the row length
    assert var["input_ids"][real].tolist() == [t for i in mb for t in ALL[i].tolist()]
    # the given labels laid out as the ids: -100 at each document's first token and where the labels say so
    want = [(-100 if j == 0 else int(v)) for i in mb for j, v in enumerate(LABELS[i])]
    assert var["labels"][real].tolist() == want
    # a --rows plan's rows are varlen_collate's to lay out; pad_collate pads the micro-batches of a plain plan
    flat = next(iter(PackedSampler(plans["plain"], rank=0, world_size=1)))
    pad = pad_collate(key="input_ids")(SourceDataset(plans["plain"]).__getitems__(flat))
    assert pad["input_ids"].dtype == torch.long and pad["lengths"].tolist() == [len(ALL[i]) for i in flat]


def test_a_dataset_of_paths_and_a_pickled_one(data):
    _, inputs, _ = data
    ds = SourceDataset(inputs)
    assert len(ds) == 500 and ds[301]["input_ids"] == CODE[1].tolist()
    again = pickle.loads(pickle.dumps(ds))
    assert again.__getitems__([3, 450, 3])[1]["input_ids"] == ALL[450].tolist()
    assert ds.units_of([1, 2, 3]) == []  # nothing for a warmer to read ahead: the ids are gathered per micro-batch


@pytest.mark.slow
def test_data_loader_workers(data):
    torch = pytest.importorskip("torch")
    from sortpack.torch import PackedBatchSampler, varlen_collate

    _, _, plans = data
    sampler = PackedBatchSampler(plans["plain"], rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(SourceDataset(plans["plain"]), batch_sampler=sampler, num_workers=2,
                                         collate_fn=varlen_collate(key="input_ids"))
    got = [b["input_ids"].tolist() for b in loader]
    want = [[t for i in mb for t in ALL[i].tolist()] for mb in PackedSampler(plans["plain"], rank=0, world_size=1)]
    assert got == want


def test_plan_loader(data):
    pytest.importorskip("torch")
    from sortpack.torch import PackedBatchSampler, PlanLoader, pad_collate

    _, _, plans = data
    loader = PlanLoader(SourceDataset(plans["split"]), PackedBatchSampler(plans["split"], rank=0, world_size=1),
                        pad_collate(key="input_ids"))
    index = PackedIndex(plans["split"])
    for batch in loader:
        i = batch["microbatch"]["microbatch"]
        ids = index.microbatch(i).tolist()
        lengths = [e - b for b, e in zip(*index.piece_ranges(i))]
        assert batch["lengths"].tolist() == lengths
        assert [row[:n] for row, n in zip(batch["input_ids"].tolist(), lengths)] == \
            _expected(ids, index.piece_ranges(i))


def test_a_changed_dataset_is_one_line(data, tmp_path):
    root, _, _ = data
    inputs = [str(write_dataset(tmp_path / "d", WEB[:50]))]
    plan = _plan(tmp_path / "plan", inputs, max_tokens=600)
    write_dataset(tmp_path / "d", WEB[:49])
    with pytest.raises(SortpackError, match=r"d.idx: 49 sequences .* the plan was built from 50"):
        SourceDataset(plan)[0]
    (tmp_path / "d.idx").unlink()
    with pytest.raises(SortpackError, match="input file of the index is missing"):
        SourceDataset(plan)
