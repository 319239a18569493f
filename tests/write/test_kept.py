"""The kept measurements: a raw dump per rank, made the metrics directory a plain write makes only on failure."""
from __future__ import annotations

import json

import numpy as np

from sortpack.parallel import SerialComm
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.plan_options import PlanOptions
from sortpack.stages.samples import SampleColumns
from sortpack.write import kept
from sortpack.write.output import OutputDir
from sortpack.write.plan_record import PlanRecord
from sortpack.write.provenance import JobInfo, Profile
from sortpack.write.sample_dirs import write_samples

FILES = [{"path": "x.parquet", "rows": 10, "bytes": 1}]


def _samples(ids: np.ndarray, size: np.ndarray, begin: np.ndarray | None = None, start: int = 0,
             total: int | None = None) -> SampleColumns:
    return SampleColumns(start, len(ids) if total is None else total, ids, size, size, None, FILES, 0, begin)


def _shards(directory) -> list[tuple[str, str]]:
    man = json.loads((directory / "manifest.json").read_text())
    return [(s["file"], s["sha256"]) for s in man["shards"]]


def _plain(tmp_path, whole: SampleColumns):
    comm = SerialComm()
    out = OutputDir(comm, tmp_path / "plain.metrics")
    write_samples(comm, out, "metrics", whole, PlanRecord(PlanOptions(AnalyzeOptions()), whole.files, Profile(comm),
                                                          JobInfo([])))
    return tmp_path / "plain.metrics"


def test_a_dump_made_a_directory_by_one_rank_is_the_plain_write_byte_for_byte(tmp_path, monkeypatch):
    # two ranks' dumps (the second with cut samples: a begin column) assembled by one rank alone
    monkeypatch.setenv("SORTPACK_TEST_SHARD_ROWS", "3")
    ids = np.array([0, 1, 2, 3, 9, 8, 7, 6, 5, 4], np.int64)  # rank 0's numbered from its first row
    size = np.arange(10, 20, dtype=np.int64)
    begin = np.array([0, 0, 0, 0, 5, 0, 0, 7, 0, 0], np.int64)
    comm = SerialComm()
    out = OutputDir(comm, tmp_path / "plan.metrics")
    parts = [_samples(ids[:4], size[:4], None, 0, 10), _samples(ids[4:], size[4:], begin[4:], 4, 10)]
    directory = out.ensure() / kept.DUMP
    directory.mkdir()
    written = []
    for rank, part in enumerate(parts):
        cols = {}
        for name, arr in part.columns().items():
            if rank == 0 and name == "sample_id":
                cols[name] = (None, arr.dtype.str)  # what dump_samples(..., ids_from_start=True) records
                continue
            disk = kept._narrow(arr)
            kept._write(directory / f"r{rank:05d}-{name}.npy", arr, disk)
            cols[name] = (disk.str, arr.dtype.str)
        written.append((part.start, len(part), cols))
    dumped = kept.Dumped(directory, written, 10, FILES, 0, PlanOptions(AnalyzeOptions()))
    manifest = kept.keep_alone(out, dumped, JobInfo([]))
    assert manifest is not None and out.commit_alone(manifest)
    assert sorted(p.name for p in (tmp_path / "plan.metrics").iterdir()) == [
        "manifest.json", "metrics-00000.arrow", "metrics-00001.arrow", "metrics-00002.arrow", "metrics-00003.arrow"]
    assert _shards(tmp_path / "plan.metrics") == _shards(_plain(tmp_path, _samples(ids, size, begin)))


def test_a_dump_is_the_columns_as_they_are_and_is_dropped_on_success(tmp_path):
    comm = SerialComm()
    output = OutputDir(comm, tmp_path / "plan")
    out = OutputDir(comm, tmp_path / "plan.metrics", inside=output)
    samples = _samples(np.arange(5, dtype=np.int64), np.full(5, 3, np.int64))
    dumped = kept.dump_samples(comm, out, samples, PlanOptions(AnalyzeOptions()), ids_from_start=True)
    assert dumped is not None
    # the ids numbered from the first row are not written, the difficulty that is the size is not
    # written twice, sizes that fit are written as int16 (or int32); nothing is hashed or moved between ranks
    assert sorted(p.name for p in dumped.directory.iterdir()) == ["r00000-size.npy"]
    assert np.load(dumped.path(0, "size")).dtype == np.int16
    assert kept._narrow(np.array([1, 1 << 20], np.int64)) == np.int32
    assert dumped.load(0, "size").dtype == np.int64 and np.array_equal(dumped.load(0, "size"), samples.size)
    assert np.array_equal(dumped.load(0, "sample_id"), samples.sample_id)
    out.discard()
    assert not out.tmp.exists() and not (tmp_path / "plan.metrics").exists()


def test_a_collective_failure_writes_the_dump_as_the_plain_write(tmp_path):
    comm = SerialComm()
    out = OutputDir(comm, tmp_path / "plan.metrics")
    samples = _samples(np.arange(7, dtype=np.int64), np.arange(7, dtype=np.int64) + 1)
    samples.size[3] = 1 << 40  # a size past int32 is written as it is
    dumped = kept.dump_samples(comm, out, samples, PlanOptions(AnalyzeOptions()))
    assert np.load(dumped.path(0, "size")).dtype == np.int64
    manifest = kept.keep_together(comm, out, dumped, Profile(comm), JobInfo([]))
    assert manifest is not None and out.commit_alone(manifest)
    assert sorted(p.name for p in (tmp_path / "plan.metrics").iterdir()) == ["manifest.json", "metrics-00000.arrow"]
    assert _shards(tmp_path / "plan.metrics") == _shards(_plain(tmp_path, samples))
