"""Tests of SourceDataset: rows by global sample id over Parquet, Arrow IPC and JSONL inputs."""
from __future__ import annotations

import os
import pickle
import sys

import pyarrow as pa
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sortpack.errors import SortpackError  # noqa: E402
from sortpack.reader import (  # noqa: E402
    MicroBatch,
    PackedIndex,
    PackedSampler,
    Samples,
    SourceDataset,  # noqa: E402
)

from reader_fixtures import corpus_texts, write_text_corpus, write_text_index  # noqa: E402


@pytest.fixture
def corpus(tmp_path):
    files = write_text_corpus(tmp_path / "data", n=50)
    return files, write_text_index(tmp_path / "ix", files, max_tokens=100)


def test_rows_by_global_sample_id(corpus):
    files, index = corpus
    texts = corpus_texts(files)
    ds = SourceDataset(index, columns=["text"], cache_units=2)
    assert len(ds) == 50
    assert [ds[i]["text"] for i in range(50)] == texts
    assert ds[-1] == {"text": texts[-1]}
    with pytest.raises(IndexError):
        ds[50]
    ids = [49, 3, 17, 3, 0, 33]  # across files, row groups and the JSONL file, with a repeat
    assert [r["text"] for r in ds.__getitems__(ids)] == [texts[i] for i in ids]


def test_a_microbatch_brings_its_shape_along(corpus):
    _, index = corpus
    ds = SourceDataset(PackedIndex(index), transform=lambda row: row["text"])
    mb = next(iter(PackedSampler(index, order="shuffle")))
    items = ds.__getitems__(mb)
    assert isinstance(items, Samples) and items.microbatch is mb
    assert items == [ds[i] for i in mb]
    assert isinstance(ds.__getitems__([1, 2]), Samples) and ds.__getitems__([1, 2]).microbatch is None


def test_arrow_ipc_files_and_plain_paths(tmp_path):
    path = tmp_path / "x.arrow"
    table = pa.table({"text": [f"row {i}" for i in range(30)], "k": list(range(30))})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=7):
            writer.write_batch(batch)
    ds = SourceDataset([str(path)])
    assert len(ds) == 30 and ds[22] == {"text": "row 22", "k": 22}
    assert [r["k"] for r in ds.__getitems__(MicroBatch([29, 0, 14]))] == [29, 0, 14]


def test_a_changed_input_file_is_refused(corpus):
    files, index = corpus
    with open(files[1]["path"], "ab") as fh:
        fh.write(b"\0")
    ds = SourceDataset(index)
    ds[0]
    with pytest.raises(SortpackError, match="the file changed"):
        ds[len(ds) // 2]


def test_pickles_without_its_cache(corpus):
    _, index = corpus
    ds = SourceDataset(index, columns=["text"])
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone._cache) == 0 and clone[5] == ds[5]
