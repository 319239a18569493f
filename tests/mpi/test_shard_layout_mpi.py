"""Index shard layout and analyze's row split across real ranks (1 rank in-process, 2-4 under mpiexec)."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack.parallel import get_comm
from sortpack.partition import balanced_blocks, index_shard_layout


@pytest.fixture(scope="module")
def comm():
    return get_comm()


def _layout_oracle(counts: np.ndarray, rows: int, per: int) -> np.ndarray:
    # sequential rule: a shard ends after the micro-batch whose samples reach a multiple of `per`
    # and after every `rows` micro-batches
    starts, run = [0], 0
    for m, c in enumerate(counts):
        before, run = run, run + int(c)
        if (run // per > before // per or (m + 1) % rows == 0) and m + 1 < len(counts):
            starts.append(m + 1)
    starts.append(len(counts))
    return np.asarray(starts if len(counts) else [0])


@pytest.mark.parametrize("m,rows,per", [(0, 5, 10), (1, 5, 10), (200, 7, 50), (500, 1000, 97), (64, 4, 1)])
def test_index_shards_do_not_depend_on_the_rank_split(comm, m, rows, per):
    rng = np.random.default_rng(m)
    counts = rng.integers(0, 40, m)
    counts[::3] = rng.integers(100, 300, len(counts[::3]))  # short and long micro-batches alike
    # an uneven split of the micro-batches over ranks, as pack leaves them
    cuts = np.sort(rng.integers(0, m + 1, comm.size - 1)) if m else np.zeros(comm.size - 1, np.int64)
    bounds = np.concatenate(([0], cuts, [m])).astype(np.int64)
    lo, hi = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    starts, dest = index_shard_layout(comm, counts[lo:hi], lo, m, rows, per)
    assert np.array_equal(starts, _layout_oracle(counts, rows, per))
    assert dest[0] == 0 and dest[-1] == m and np.all(np.diff(dest) >= 0)
    assert set(dest.tolist()) <= set(starts.tolist())  # ranks own whole shards
    if len(starts) - 1 >= 4 * comm.size:
        assert np.all(np.diff(dest) > 0)  # with enough shards, every rank writes


def test_balanced_blocks_spread_by_weight():
    assert balanced_blocks(np.ones(8), 4).tolist() == [0, 2, 4, 6, 8]
    # the heavy item, midpoint in the second half, goes with the items after it
    assert balanced_blocks(np.array([1, 1, 1, 10, 1, 1, 1.0]), 2).tolist() == [0, 3, 7]
    assert balanced_blocks(np.zeros(0), 3).tolist() == [0, 0, 0, 0]


def _shared_dir(comm):
    import tempfile

    return comm.bcast_obj(tempfile.mkdtemp(prefix="sp-layout-") if comm.is_root() else None)


def _write_inputs(comm, layout: str) -> list[str]:
    import json
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    d = _shared_dir(comm)
    rng = np.random.default_rng(7)
    paths = []
    if layout == "one-row-group":
        n = 1001
        specs = [("a.parquet", n, n)]
    else:  # unequal row groups and an Arrow file (+ a JSONL file, rows unknown until parsed)
        specs = [("a.parquet", 37, 37), ("b.parquet", 900, 450), ("c.arrow", 200, 30), ("e.parquet", 5, 2)]
        if layout == "with-jsonl":
            specs.insert(3, ("d.jsonl", 50, 0))
    for name, rows, group in specs:
        p = os.path.join(d, name)
        texts = ["x" * int(k) for k in rng.integers(0, 50, rows)]
        if comm.is_root():
            table = pa.table({"text": texts})
            if name.endswith(".parquet"):
                pq.write_table(table, p, row_group_size=group)
            elif name.endswith(".arrow"):
                with pa.ipc.new_file(p, table.schema) as w:
                    for b in table.to_batches(max_chunksize=group):
                        w.write_batch(b)
            else:
                with open(p, "w") as fh:
                    fh.writelines(json.dumps({"text": t}) + "\n" for t in texts)
        paths.append(p)
    comm.barrier()
    return paths


@pytest.mark.parametrize("layout", ["one-row-group", "mixed", "with-jsonl"])
def test_analyze_splits_rows_evenly_and_keeps_ids(comm, layout):
    from sortpack.parallel import SerialComm
    from sortpack.stages.analyze import AnalyzeOptions, analyze

    paths = _write_inputs(comm, layout)
    opts = AnalyzeOptions(column="text")
    mine = analyze(comm, paths, opts)
    whole = analyze(SerialComm(), paths, opts)  # the one-rank oracle
    n = whole.total
    assert mine.total == n
    assert np.array_equal(mine.sample_id, np.arange(mine.start, mine.start + len(mine)))
    assert np.array_equal(mine.size, whole.size[mine.start:mine.start + len(mine)])
    counts = comm.allgatherv(np.array([len(mine)], np.int64))
    assert counts.sum() == n
    if layout != "with-jsonl":
        # whatever the row groups (one for the whole file included), every rank gets N/P within a row;
        # a JSONL file is read whole by one rank and weighed by its bytes, so it may unbalance the split
        assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("files", [1, 10, 23])
def test_each_rank_describes_only_its_slice_of_the_files(comm, files, monkeypatch):
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sortpack.stages import analyze as analyze_mod

    opened_paths = []

    def counting_open_source(path, fmt):
        opened_paths.append(path)
        return open_source(path, fmt)

    open_source = analyze_mod.open_source
    monkeypatch.setattr(analyze_mod, "open_source", counting_open_source)

    d = _shared_dir(comm)
    paths = [os.path.join(d, f"p{i:03d}.parquet") for i in range(files)]
    if comm.is_root():
        for i, p in enumerate(paths):
            pq.write_table(pa.table({"n": np.arange(i + 1)}), p, row_group_size=max(1, i // 2 + 1))
    comm.barrier()
    described = analyze_mod._describe_all(comm, [d], "auto")
    opened = len(opened_paths)
    assert opened == (files * (comm.rank + 1)) // comm.size - (files * comm.rank) // comm.size
    assert opened <= -(-files // comm.size)  # O(files / P) footers per rank, not all of them
    # every rank still sees every file's row groups, in sample-id order
    assert [s.path for s in described] == paths
    assert [sum(s.unit_rows) for s in described] == list(range(1, files + 1))
