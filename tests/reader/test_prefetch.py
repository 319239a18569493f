"""Prefetcher / Prefetched: the byte ranges it warms, its bounded lookahead, and that it changes nothing read."""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.reader import PackedIndex, Prefetched, Prefetcher
from sortpack.reader.prefetch import _ShardRanges
from sortpack.torch import PackedBatchSampler, SourceDataset

from support import run_sortpack


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """A stored plan of strings (with nulls), list<int32> and int64 columns in several data shards."""
    tmp = tmp_path_factory.mktemp("prefetch")
    rng = np.random.default_rng(11)
    n = 1500
    k = rng.integers(1, 120, n)
    null = rng.random(n) < 0.1
    table = pa.table({
        "text": pa.array([None if z else "é" * int(x) for x, z in zip(k, null)], pa.string()),
        "ids": pa.array([list(range(int(x) % 17)) for x in k], pa.list_(pa.int32())),
        "n": pa.array(k),
    })
    pq.write_table(table, tmp / "in.parquet", row_group_size=200)
    out = tmp / "plan"
    run_sortpack(["run", tmp / "in.parquet", "-o", out, "--size", "column:n", "--max-tokens", "400", "--quiet",
                  "--store", "text,ids,n"], env={"SORTPACK_TEST_DATA_ROWS": "400"})
    return out


def _wait(cond, seconds=10.0):
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < seconds:
        time.sleep(0.01)
    return cond()


@pytest.mark.slow
def test_hinted_ranges_hold_every_byte_a_microbatch_reads(plan):
    # a copy of each shard holding only its metadata and the hinted ranges of one micro-batch
    # must read back that micro-batch exactly: the hints miss no byte the reader touches
    stored = PackedIndex(plan).stored
    entries = stored.index.manifest["data"]["shards"]
    assert len(entries) > 2
    checked = 0
    for entry in entries:
        path = plan / entry["file"]
        raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        shard = _ShardRanges(str(path))
        body = np.zeros(len(raw), bool)
        for _, at, size, _, _ in shard.parts:
            body[at:at + size] = True
        original = pa.ipc.open_file(pa.BufferReader(raw.tobytes())).get_batch(0)
        first = int(entry["first"])
        starts = stored.row_start[(stored.row_start >= first) & (stored.row_start <= first + int(entry["rows"]))]
        for a, b in zip((starts[:-1] - first).tolist(), (starts[1:] - first).tolist()):
            copy = np.where(body, 0, raw).astype(np.uint8)
            hinted = 0
            for offset, length in shard.ranges(a, b):
                copy[offset:offset + length] = raw[offset:offset + length]
                hinted += length
            got = pa.ipc.open_file(pa.BufferReader(copy.tobytes())).get_batch(0).slice(a, b - a)
            assert got.to_pylist() == original.slice(a, b - a).to_pylist()
            # tight: the rows' bytes plus an offset and a validity byte or two per buffer
            need = sum(c.slice(a, b - a).nbytes for c in original.columns)
            assert hinted <= need + 16 * len(shard.parts), (hinted, need)
            checked += 1
        shard.close()
    assert checked == stored.index.num_microbatches


def test_lookahead_is_bounded_by_bytes_and_follows_the_reader(plan):
    stored = PackedIndex(plan).stored
    order = np.random.default_rng(0).permutation(stored.index.num_microbatches)
    warm = Prefetcher(stored, order, ahead_bytes=1, whole=False)
    try:
        assert _wait(lambda: warm.hinted == 1)
        time.sleep(0.1)
        assert warm.hinted == 1  # one micro-batch is a byte or more ahead: it waits for the reader
        warm.advance(5)
        assert _wait(lambda: warm.hinted == 6)
    finally:
        warm.stop()
    assert not warm._thread.is_alive() and warm.error is None
    with Prefetcher(stored, order, whole=False) as whole:  # unbounded: hints everything, then ends alone
        assert _wait(lambda: not whole._thread.is_alive())
        assert whole.hinted == len(order) and whole.error is None
        assert whole.hinted_bytes > 0 and not whole._shards  # its files are closed


def test_whole_shards_when_the_order_reads_most_of_them(plan):
    index = PackedIndex(plan)
    stored = index.stored
    entries = index.manifest["data"]["shards"]
    one = PackedBatchSampler(index, rank=0, world_size=1, order="shuffle").schedule().reshape(-1)
    four = PackedBatchSampler(index, rank=1, world_size=4, order="shuffle").schedule().reshape(-1)
    assert Prefetcher(stored, one, start=False).whole and not Prefetcher(stored, four, start=False).whole
    with Prefetcher(stored, one) as warm:  # each shard hinted once, whole, in the order first needed
        assert _wait(lambda: not warm._thread.is_alive())
        assert warm.hinted == len(one) and warm.error is None
        assert warm.hinted_bytes == sum((plan / e["file"]).stat().st_size for e in entries)
        assert len(warm._whole_done) == len(entries)
    warm = Prefetcher(stored, one, ahead_bytes=1)
    try:  # bounded by bytes: the first shard is ahead of the reader, and micro-batches in it cost nothing
        assert _wait(lambda: len(warm._whole_done) == 1)
        time.sleep(0.1)
        assert len(warm._whole_done) == 1
    finally:
        warm.stop()


def test_prefetched_sampler_yields_what_the_sampler_yields(plan):
    index = PackedIndex(plan)
    ds = SourceDataset(plan)
    plain = PackedBatchSampler(index, rank=1, world_size=2, order="shuffle", seed=4)
    warmed = Prefetched(PackedBatchSampler(index, rank=1, world_size=2, order="shuffle", seed=4))
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        warmed.set_epoch(epoch)  # the sampler's own methods
        assert len(warmed) == len(plain)
        got = [(mb.microbatch, list(mb), ds.__getitems__(mb).table.to_pylist()) for mb in warmed]
        want = [(mb.microbatch, list(mb), ds.__getitems__(mb).table.to_pylist()) for mb in plain]
        assert got == want
        assert warmed.last.error is None and not warmed.last._thread.is_alive()
        assert warmed.last.hinted >= 1
    assert warmed.state_dict() == plain.state_dict()


def test_prefetched_as_a_dataloader_batch_sampler(plan):
    torch = pytest.importorskip("torch")
    index = PackedIndex(plan)
    loader = torch.utils.data.DataLoader(SourceDataset(plan, columns=["n"]),
                                         batch_sampler=Prefetched(PackedBatchSampler(index, order="shuffle")),
                                         collate_fn=lambda rows: [r["n"] for r in rows])
    plain = PackedBatchSampler(index, order="shuffle")
    n = index.stored.take(index.all_sample_ids()).column("n").to_pylist()
    row_of = dict(zip(index.all_sample_ids().tolist(), n))
    assert list(loader) == [[row_of[i] for i in mb] for mb in plain]


@pytest.mark.slow
def test_prefetched_needs_stored_data(tmp_path):
    from support import write_text_parquet

    src = write_text_parquet(tmp_path / "in.parquet", np.arange(1, 50))
    run_sortpack(["run", src, "-o", tmp_path / "plain", "--column", "text", "--max-tokens", "100", "--quiet"])
    with pytest.raises(ValueError, match="stores no data"):
        Prefetched(PackedBatchSampler(PackedIndex(tmp_path / "plain")))
