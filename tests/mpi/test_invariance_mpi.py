"""Rank-count identity of whole CLI jobs, in process: each runner (2, 3 and 4 ranks) runs a job on
rank 0 alone and then on every rank, and both must write the same bytes and content_hash.

With the three runners of tests/base/test_mpi_suite.py that is 1 against 2, 3 and 4 ranks without
starting a process per rank count. tests/cli keeps one end-to-end invariance test per packing
mode family under real ``mpiexec`` jobs.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import sortpack.parallel as parallel
from sortpack.cli import main
from sortpack.parallel import SerialComm, get_comm
from sortpack.reader import PackedIndex

from support import assert_same_outputs, read_manifest, write_text_parquet


@pytest.fixture(scope="module")
def comm():
    return get_comm()


@pytest.fixture
def shared(comm):
    """A directory every rank sees (rank 0 makes and removes it)."""
    d = Path(comm.bcast_obj(tempfile.mkdtemp(prefix="sp-invariance-") if comm.is_root() else None))
    yield d
    comm.barrier()
    if comm.is_root():
        shutil.rmtree(d, ignore_errors=True)


def _job(args: list, on) -> None:
    """Run ``sortpack ARGS`` in this process on communicator ``on``; fail unless it exits 0."""
    saved = parallel._WORLD  # the CLI asks get_comm() for the job's communicator
    parallel._WORLD = on
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        assert exc.code in (0, None), f"sortpack {' '.join(map(str, args))} exited {exc.code}"
    finally:
        parallel._WORLD = saved


def _alone(comm, base: Path, jobs: list[list]) -> None:
    """Run ``jobs`` on rank 0 alone (a one-rank communicator) into ``base/one`` while the others wait."""
    done = base / "one.done"
    if comm.is_root():
        status = "ok"
        try:
            for args in jobs:
                _job([str(a).replace("{d}", str(base / "one")) for a in args], SerialComm())
        except BaseException as exc:  # the others must not wait for ever
            status = f"{type(exc).__name__}: {exc}"
            raise
        finally:  # written whole, then renamed: a waiting rank never reads half a status
            (base / "one.status").write_text(status)
            (base / "one.status").rename(done)
    else:
        while not done.exists():  # sleep, not a busy MPI barrier: rank 0 has the cores to itself
            time.sleep(0.02)
    status = done.read_text()
    assert status == "ok", f"rank 0 alone: {status}"
    comm.barrier()


def alone_and_together(comm, base: Path, jobs: list[list], outputs: list[str]) -> list[tuple[Path, Path]]:
    """Run ``jobs`` (``{d}`` stands for the job's directory) at one rank and at every rank; compare ``outputs``.

    Every rank checks that each output directory holds the same files, byte for byte, and the same
    content_hash at both rank counts; returns the (one rank, all ranks) pairs of output directories.
    """
    (base / "one").mkdir(exist_ok=True) if comm.is_root() else None
    (base / "all").mkdir(exist_ok=True) if comm.is_root() else None
    comm.barrier()
    _alone(comm, base, jobs)
    for args in jobs:
        _job([str(a).replace("{d}", str(base / "all")) for a in args], comm)
    pairs = [(base / "one" / name, base / "all" / name) for name in outputs]
    for one, together in pairs:
        assert_same_outputs(one, together)
        assert read_manifest(one)["provenance"]["world_size"] == 1
        assert read_manifest(together)["provenance"]["world_size"] == comm.size
    return pairs


def _text_files(comm, base: Path) -> list[Path]:
    """Three parquet files of random-length text (3 x 700 rows, row groups of 250), as conftest's text_dataset."""
    lengths = np.random.default_rng(7).integers(1, 300, size=2100)
    files = [base / f"part-{k}.parquet" for k in range(3)]
    if comm.is_root():
        for k, f in enumerate(files):
            write_text_parquet(f, lengths[k * 700:(k + 1) * 700], 250)
    comm.barrier()
    return files


def test_analyze_sort_and_pack_jobs_are_identical_at_any_rank_count(comm, shared, monkeypatch):
    monkeypatch.setenv("SORTPACK_TEST_SHARD_ROWS", "100")
    files = _text_files(comm, shared)
    alone_and_together(comm, shared, [
        ["analyze", *files, "-o", "{d}/metrics", "--column", "text", "--quiet"],
        ["sort", "{d}/metrics", "-o", "{d}/sorted", "--descending", "--quiet"],
        ["pack", "{d}/sorted", "-o", "{d}/index", "--max-tokens", "1500", "--segment-size", "700", "--quiet"],
    ], ["metrics", "sorted", "index"])


def test_64_bit_sample_ids_are_identical_at_any_rank_count(comm, shared, monkeypatch):
    import pyarrow as pa

    monkeypatch.setenv("SORTPACK_TEST_SHARD_ROWS", "100")
    monkeypatch.setenv("SORTPACK_TEST_ID_BITS", "64")
    files = _text_files(comm, shared)
    [(one, _)] = alone_and_together(comm, shared, [
        ["run", *files, "-o", "{d}/plan", "--column", "text", "--max-tokens", "1500", "--segment-size", "700",
         "--quiet"]], ["plan"])
    m = read_manifest(one)
    assert m["schema"]["sample_ids"] == "list<item: int64>" and len(m["shards"]) >= 2
    table = pa.concat_tables(pa.ipc.open_file(str(one / e["file"])).read_all() for e in m["shards"])
    assert table.schema.field("sample_ids").type == pa.list_(pa.int64())
    assert sorted(np.concatenate(table["sample_ids"].to_numpy(zero_copy_only=False)).tolist()) == list(range(2100))


EMPTY_MODES = {"padded": ["--max-tokens", "400", "--segment-size", "300"],
               "shapes": ["--max-tokens", "400", "--shapes", "16,64,128", "--segment-size", "300"],
               "rows": ["--rows", "128", "--rows-per-microbatch", "2"]}


@pytest.mark.parametrize("mode", sorted(EMPTY_MODES))
def test_empty_samples_are_dropped_identically_at_any_rank_count(comm, shared, monkeypatch, mode):
    monkeypatch.setenv("SORTPACK_TEST_SHARD_ROWS", "50")
    lengths = np.random.default_rng(4).integers(1, 100, size=600)
    lengths[np.random.default_rng(5).choice(600, size=90, replace=False)] = 0
    files = [shared / "a.parquet", shared / "b.parquet"]
    if comm.is_root():
        write_text_parquet(files[0], lengths[:350], row_group_size=70)
        write_text_parquet(files[1], lengths[350:], row_group_size=70)
    comm.barrier()
    [(one, _)] = alone_and_together(comm, shared, [
        ["run", *files, "-o", "{d}/plan", "--column", "text", "--quiet", *EMPTY_MODES[mode]]], ["plan"])
    ix = PackedIndex(one)
    assert np.sort(ix.all_sample_ids()).tolist() == np.flatnonzero(lengths > 0).tolist()  # ids are kept
    assert (ix["tokens"] > 0).all()  # never a micro-batch of pure padding
    assert read_manifest(one)["stats"]["empty_dropped"] == 90
    assert int(ix["tokens"].sum()) == int(lengths.sum())  # every token is still there


def test_input_fingerprints_are_identical_at_any_rank_count(comm, shared):
    inputs = [shared / "a.jsonl", shared / "b.parquet", shared / "c.jsonl"]
    if comm.is_root():
        for path, n in ((inputs[0], 300), (inputs[2], 200)):
            path.write_text("".join(json.dumps({"text": "abcdefghij"[: 1 + i % 10] * (1 + (i * 7) % 30)}) + "\n"
                                    for i in range(n)))
        write_text_parquet(inputs[1], np.arange(1, 500) % 70 + 1, row_group_size=50)
    comm.barrier()
    for one, together in alone_and_together(comm, shared, [
            ["run", *inputs, "-o", "{d}/ix", "--column", "text", "--max-tokens", 300, "--quiet"]], ["ix"]):
        for m in (read_manifest(one), read_manifest(together)):
            assert [f["sha256_of"] for f in m["source"]["files"]] == ["file", "footer", "file"]
            assert m["provenance"]["source_mtime_ns"] == [p.stat().st_mtime_ns for p in inputs]
