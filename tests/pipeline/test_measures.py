"""Per-sample measures (``SampleColumns.measures``): measured by analyze, carried through sort and pack,
summed per micro-batch in the index, totalled in the manifest and handed out by the reader."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from sortpack.parallel import SerialComm
from sortpack.reader import PackedIndex, PackedSampler
from sortpack.stages.samples import SampleColumns
from sortpack.stages.split import PieceCut, split_samples

from support import assert_same_at_ranks, lognormal, read_manifest, run_sortpack, write_text_parquet

N = 1500


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A text set with a second per-sample number (``patches``) weakly tied to the text's length."""
    d = tmp_path_factory.mktemp("measures")
    sizes = lognormal(N, seed=3, maximum=3000)
    rng = np.random.default_rng(4)
    patches = (sizes // 4 + rng.integers(0, 400, N)).astype(np.int64)
    write_text_parquet(d / "a.parquet", sizes, row_group_size=400, extra={"patches": patches})
    return d, sizes, patches


def index_table(directory) -> pa.Table:
    """Return every micro-batch row of an index directory, in order."""
    man = read_manifest(directory)
    return pa.concat_tables([ipc.open_file(str(directory / s["file"])).read_all() for s in man["shards"]])


def check_sums(table: pa.Table, sizes: np.ndarray, patches: np.ndarray, padded: bool) -> None:
    """Assert each micro-batch's size2 and attention are its samples' sums (every sample once)."""
    ids = [np.asarray(x, np.int64) for x in table.column("sample_ids").to_pylist()]
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(N))
    got = table.column("size2").to_numpy()
    assert got.dtype == np.int64
    assert np.array_equal(got, [int(patches[i].sum()) for i in ids])
    attention = table.column("attention").to_numpy()
    if padded:
        want = table.column("batch_size").to_numpy().astype(np.int64) * table.column("padded_size").to_numpy() ** 2
    else:
        want = np.array([int((sizes[i] ** 2).sum()) for i in ids])
    assert np.array_equal(attention, want)


@pytest.mark.parametrize("extra,padded", [([], True), (["--rows", "4096"], False),
                                          (["--budget", "tokens"], False),
                                          (["--group-size", "2", "--same-shape"], True)])
def test_a_measure_travels_from_analyze_to_the_index(data, tmp_path, extra, padded):
    d, sizes, patches = data
    out = tmp_path / "plan"
    run_sortpack(["run", d / "a.parquet", "-o", out, "--max-tokens", "8192", "--size2", "column:patches",
                  "--segment-size", "512", *extra])
    check_sums(index_table(out), sizes, patches, padded)
    stats = read_manifest(out)["stats"]
    assert stats["size2"] == int(patches.sum())
    assert stats["attention"] == int(index_table(out).column("attention").to_numpy().sum())


@pytest.mark.slow
def test_the_stage_commands_keep_the_measure_in_their_directories(data, tmp_path):
    d, sizes, patches = data
    run_sortpack(["analyze", d / "a.parquet", "-o", tmp_path / "m", "--size2", "column:patches"])
    run_sortpack(["sort", tmp_path / "m", "-o", tmp_path / "s"], ranks=2)
    run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "i", "--max-tokens", "8192"], ranks=3)
    for kind in ("m", "s"):
        table = index_table(tmp_path / kind)
        assert table.schema.field("size2").type == pa.int64()
        assert np.array_equal(table.column("size2").to_numpy(), patches[table.column("sample_id").to_numpy()])
        assert read_manifest(tmp_path / kind)["stats"]["size2"] == int(patches.sum())
        assert json.loads(run_sortpack(["inspect", tmp_path / kind, "--json"]).stdout)["size2"] == int(patches.sum())
    check_sums(index_table(tmp_path / "i"), sizes, patches, padded=True)


@pytest.mark.slow
def test_plans_without_measures_hold_no_measure_column(data, tmp_path):
    d, _, _ = data
    run_sortpack(["analyze", d / "a.parquet", "-o", tmp_path / "m"])
    run_sortpack(["run", d / "a.parquet", "-o", tmp_path / "i", "--max-tokens", "8192"])
    assert index_table(tmp_path / "m").column_names == ["sample_id", "size", "difficulty"]
    names = index_table(tmp_path / "i").column_names
    assert "attention" in names and "size2" not in names
    assert "size2" not in read_manifest(tmp_path / "i")["stats"]


@pytest.mark.slow
def test_a_plan_with_a_measure_is_the_same_at_any_rank_count(data, tmp_path):
    d, sizes, patches = data
    outs = assert_same_at_ranks(["run", d / "a.parquet", "--rows", "4096", "--size2", "column:patches",
                                 "--segment-size", "256", "--oversize", "skip"], tmp_path)
    table = index_table(outs[0])
    assert int(table.column("size2").to_numpy().sum()) == int(patches.sum())


@pytest.mark.slow
def test_the_reader_hands_out_each_micro_batch_s_sums_and_the_step_s(data, tmp_path):
    d, sizes, patches = data
    out = tmp_path / "plan"
    run_sortpack(["run", d / "a.parquet", "-o", out, "--rows", "4096", "--size2", "column:patches",
                  "--measure", "lengths=column:n"])
    index = PackedIndex(out)
    assert index.sum_columns == ("attention", "lengths", "size2")
    assert read_manifest(out)["options"]["measures"] == {"lengths": "column:n"}
    w, a = 2, 2
    mbs = [list(PackedSampler(index, rank=r, world_size=w, grad_accum=a)) for r in range(w)]
    for mb in mbs[0] + mbs[1]:
        assert mb.size2 == int(patches[list(mb)].sum())
        assert mb.attention == int((sizes[list(mb)] ** 2).sum())
        assert mb.targets == mb.tokens - len(mb)  # no targets column: every token but each document's first
        assert mb.info()["size2"] == mb.size2
        assert mb.measures == {"size2": mb.size2, "lengths": mb.tokens} == {k: mb.info()[k] for k in mb.measures}
    for k in range(0, len(mbs[0]), a):
        step = mbs[0][k:k + a] + mbs[1][k:k + a]
        assert all(mb.step_attention == sum(m.attention for m in step) for mb in step)
        assert all(mb.step_targets == sum(m.targets for m in step) for mb in step)


def test_split_pieces_share_their_sample_s_measure_exactly():
    size = np.array([10, 25, 3], np.int64)
    m = np.array([7, 11, 5], np.int64)
    samples = SampleColumns(0, 3, np.arange(3, dtype=np.int64), size, size, measures={"size2": m})
    out, _ = split_samples(SerialComm(), samples, size > 8, PieceCut(8))
    assert list(out.sample_id) == [0, 0, 1, 1, 1, 1, 2]
    piece = out.measures["size2"]
    assert np.array_equal(np.bincount(out.sample_id, weights=piece).astype(np.int64), m)
    assert np.all(piece >= 0)
    assert list(piece[2:6]) == [3, 4, 3, 1]  # 11 over 8+8+8+1 units: floor(11*e/25) differences


def test_sample_columns_carry_measures_through_select_and_columns():
    size = np.array([4, 3, 2, 1])
    s = SampleColumns(5, 9, np.arange(5, 9), size, size, measures={"size2": np.array([40, 30, 20, 10])})
    kept = s.select(np.array([True, False, True, False]), 0, 2)
    assert list(kept.measures["size2"]) == [40, 20]
    back = SampleColumns.from_columns(0, 2, kept.columns(), [])
    assert list(back.measures["size2"]) == [40, 20] and list(back.columns()) == ["sample_id", "size", "size2"]


def test_a_mixture_sums_the_measure_of_each_micro_batch(tmp_path):
    rng = np.random.default_rng(5)
    patches = {}
    for name, n in (("web", 700), ("books", 300)):
        (tmp_path / name).mkdir()
        sizes = lognormal(n, seed=len(name), maximum=2000)
        patches[name] = rng.integers(0, 300, n).astype(np.int64)
        write_text_parquet(tmp_path / name / "part.parquet", sizes, extra={"patches": patches[name]})
    out = tmp_path / "plan"
    run_sortpack(["run", "--blend", f"70 {tmp_path / 'web'} 30 {tmp_path / 'books'}", "--total-tokens", "300000",
                  "--max-tokens", "8192", "--size2", "column:patches", "-o", out], ranks=2)
    every = np.concatenate((patches["web"], patches["books"]))  # global ids: sources in order
    table = index_table(out)
    ids = table.column("sample_ids").to_pylist()
    assert np.array_equal(table.column("size2").to_numpy(), [int(every[i].sum()) for i in ids])
    assert read_manifest(out)["stats"]["size2"] == int(table.column("size2").to_numpy().sum())


def test_size2_refuses_oversize_split(data, tmp_path):
    d, _, _ = data
    proc = run_sortpack(["run", d / "a.parquet", "-o", tmp_path / "p", "--max-tokens", "1000", "--size2",
                         "column:patches", "--oversize", "split"], check=False)
    assert proc.returncode == 2 and "--size2 column:patches" in proc.stderr
    assert not (tmp_path / "p").exists()


def test_a_failed_run_keeps_the_measure_in_its_metrics(data, tmp_path):
    d, _, patches = data
    proc = run_sortpack(["run", d / "a.parquet", "-o", tmp_path / "p", "--max-tokens", "1000", "--size2",
                         "column:patches"], check=False, ranks=2)
    assert proc.returncode == 2
    kept = index_table(tmp_path / "p.metrics")
    assert np.array_equal(kept.column("size2").to_numpy(), patches[kept.column("sample_id").to_numpy()])
