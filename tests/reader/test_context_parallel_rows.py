"""Row packing with --pad-to-multiple K (context parallelism): read back through varlen_collate(pad_to_multiple=K)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from sortpack.errors import SortpackError  # noqa: E402
from sortpack.reader import PackedIndex  # noqa: E402
from sortpack.stages.pack import PackOptions  # noqa: E402
from sortpack.torch import PackedBatchSampler, PackedDataset, varlen_collate  # noqa: E402

from reader_fixtures import pipeline_index  # noqa: E402

ROW = 8192
K = 8  # CP = 4: every document a multiple of 2 x CP


def chat_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Return long-tail chat-like lengths: log-normal, median 600, clipped to 16..ROW."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(600), 1.2, n)), 16, ROW).astype(np.int64)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("cp")
    lengths = chat_lengths(1200)
    padded = PackedIndex(pipeline_index(d / "k8", lengths, rows=ROW, pad_to_multiple=K))
    plain = PackedIndex(pipeline_index(d / "plain", lengths, rows=ROW))
    return lengths, padded, plain


def fill(index: PackedIndex) -> float:
    """Return the real tokens over the rows' room."""
    return float(index["tokens"].sum()) / float(index["batch_size"].sum() * ROW)


def test_every_padded_row_fits_and_keeps_every_token(plans):
    lengths, index, _ = plans
    seqs = {i: np.arange(int(n), dtype=np.int64) + 1 for i, n in enumerate(lengths)}
    collate = varlen_collate(pad_id=0, pad_to_multiple=K)
    seen = 0
    for mb in PackedBatchSampler(index, rank=0, world_size=1):
        out = collate(PackedDataset(seqs).__getitems__(mb))
        assert out["row_shape"] == (mb.batch_size, ROW)  # no row longer than ROW_LEN
        assert out["lengths"].tolist() == [int(lengths[i]) for i in mb]  # no token cut
        padded = out["cu_seqlens_padded"].numpy()
        docs = out["seq_index"].numpy() >= 0
        assert np.all(np.diff(padded)[docs] % K == 0)  # each document padded to a multiple of K
        assert np.all(np.diff(out["cu_seqlens"].numpy())[docs] == [lengths[mb[j]] for j in
                                                                  out["seq_index"].numpy()[docs]])
        seen += len(mb)
    assert seen == len(lengths)


def test_the_real_token_fill_stays_within_half_a_percent_of_the_unpadded_plan(plans):
    _, padded, plain = plans
    assert padded.options["pad_to_multiple"] == K
    assert fill(plain) - fill(padded) <= 0.005
    assert fill(padded) > 0.98


def test_an_unpadded_plan_overflows_its_rows_once_documents_are_padded(plans):
    lengths, _, plain = plans
    rows = 0
    for mb in PackedBatchSampler(plain, rank=0, world_size=1):
        ids = np.asarray(mb)
        splits = np.asarray(mb.row_splits)
        rounded = -(-lengths[ids] // K) * K
        rows += int(np.sum(np.add.reduceat(rounded, splits[:-1]) > ROW)) if len(ids) else 0
    assert rows > 0  # what --pad-to-multiple in the plan prevents


def test_the_row_length_must_be_a_multiple_of_k():
    with pytest.raises(SortpackError, match="multiple of K"):
        PackOptions(rows=1000, pad_to_multiple=16).validate()
    PackOptions(rows=1024, pad_to_multiple=16).validate()


@pytest.mark.slow
def test_a_padded_row_plan_is_the_same_at_any_rank_count(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from support import assert_same_at_ranks

    pq.write_table(pa.table({"n": chat_lengths(3000, seed=4)}), tmp_path / "chat.parquet", row_group_size=500)
    assert_same_at_ranks(["run", tmp_path / "chat.parquet", "--size", "column:n", "--rows", str(ROW),
                          "--pad-to-multiple", str(K)], tmp_path)
