"""How ``sortpack export --to megatron`` writes: chunks and workers, the dtype guessed from the first tokens (and
written again when later ones outgrow it), the allocation of the ``.bin`` (sortpack.write.export.chunk_writer and
megatron_out)."""
from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.errors import SortpackError
from sortpack.format.megatron import read_index
from sortpack.parallel import SerialComm
from sortpack.reader import PackedIndex
from sortpack.write.export import ExportRequest, chunk_writer, export_plan, megatron_out

from megatron_files import random_sequences, write_dataset
from support import MPIEXEC, run_sortpack

SEQS = random_sequences(300, seed=7, vocab=1000)
BIG = 70_000  # an id that needs int32


def _planned(plan: Path) -> list[int]:
    index = PackedIndex(plan)
    return [int(s) for i in range(index.num_microbatches) for s in index.microbatch(i).tolist()]


def _stored_plan(root: Path, big: int | None) -> Path:
    """Return a plan storing SEQS from Parquet, sample ``big``'s last id set to BIG."""
    from megatron_files import plan_in_process

    seqs = [s.copy() for s in SEQS]
    if big is not None:
        seqs[big][-1] = BIG
    name = f"p{big}"
    pq.write_table(pa.table({"input_ids": [s.tolist() for s in seqs]}), root / f"{name}.parquet")
    return plan_in_process(root / name, [root / f"{name}.parquet"], {"column": "input_ids"}, ("input_ids",),
                           max_tokens=900)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A stored plan whose one big id lies in its last sample in plan order, and the sequences it holds."""
    root = tmp_path_factory.mktemp("writer")
    last = _planned(_stored_plan(root, None))[-1]  # the plan depends on the lengths alone: the same order
    plan = _stored_plan(root, last)
    seqs = [s.copy() for s in SEQS]
    seqs[last][-1] = BIG
    return root, plan, [seqs[s].tolist() for s in _planned(plan)]


def _read(prefix: Path) -> tuple[list[list[int]], np.dtype, bytes]:
    index = read_index(Path(f"{prefix}.idx").read_bytes(), "x")
    data = np.frombuffer(Path(f"{prefix}.bin").read_bytes(), dtype=index.dtype)
    size = index.dtype.itemsize
    seqs = [data[p // size:p // size + n].tolist() for p, n in zip(index.pointers.tolist(), index.lengths.tolist())]
    return seqs, index.dtype, Path(f"{prefix}.bin").read_bytes() + Path(f"{prefix}.idx").read_bytes()


@pytest.mark.parametrize("tokens, workers, scratch", [(1, 1, 4), (7, 2, 8), (300, 2, 64), (None, 2, 1 << 19),
                                                      (None, 1, 1 << 19)])
def test_every_chunking_writes_the_same_bytes(plans, tmp_path, monkeypatch, tokens, workers, scratch):
    _, plan, want = plans
    if tokens is not None:
        monkeypatch.setenv("SORTPACK_TEST_EXPORT_TOKENS", str(tokens))
    monkeypatch.setattr(chunk_writer, "WORKERS", workers)
    monkeypatch.setattr(chunk_writer, "SCRATCH_BYTES", scratch)
    export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "out")))
    seqs, dtype, _ = _read(tmp_path / "out")
    assert seqs == want and dtype == np.int32


def test_a_guess_too_narrow_is_written_again(plans, tmp_path, monkeypatch):
    _, plan, want = plans
    calls = []
    real = megatron_out._write_all
    monkeypatch.setattr(megatron_out, "_write_all", lambda *a: calls.append(a[2][0].dtype) or real(*a))
    monkeypatch.setenv("SORTPACK_TEST_EXPORT_TOKENS", "50")  # the guess sees the first 50 tokens: small ids
    export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "a")))
    assert calls == [np.uint16, np.int32]
    monkeypatch.delenv("SORTPACK_TEST_EXPORT_TOKENS")
    calls.clear()
    export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "b")))
    assert calls == [np.int32]  # the whole small plan is one chunk: guessed right at once
    assert _read(tmp_path / "a") == _read(tmp_path / "b") and _read(tmp_path / "a")[0] == want


def _fallocate_failing(code: int):
    def fallocate(fd, mode, offset, size):
        ctypes.set_errno(code)
        return -1
    return lambda: fallocate


def test_a_file_system_without_fallocate_gets_a_sized_file(plans, tmp_path, monkeypatch):
    _, plan, want = plans
    export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "a")))
    monkeypatch.setattr(chunk_writer, "_fallocate", _fallocate_failing(errno.EOPNOTSUPP))
    export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "b")))
    assert _read(tmp_path / "b") == _read(tmp_path / "a")


def test_a_full_disk_is_one_line_before_any_token_and_leaves_nothing(plans, tmp_path, monkeypatch):
    _, plan, _ = plans
    monkeypatch.setattr(chunk_writer, "_fallocate", _fallocate_failing(errno.ENOSPC))
    copied = []
    monkeypatch.setattr(chunk_writer, "write_runs", lambda *a: copied.append(a))
    with pytest.raises(SortpackError, match=r"out/x.bin: cannot write the export \(No space left on device\)"):
        export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "out" / "x")))
    assert not copied and not (tmp_path / "out").exists()


def test_the_allocation_is_real_where_the_file_system_has_it(tmp_path):
    with open(tmp_path / "f", "wb") as fh:
        chunk_writer.reserve(fh.fileno(), 1 << 20)
    st = os.stat(tmp_path / "f")
    assert st.st_size == 1 << 20
    if chunk_writer._fallocate() is not None and st.st_blocks:  # (a file system without it: a hole)
        assert st.st_blocks * 512 >= 1 << 20


@pytest.mark.slow
def test_a_plan_of_objects_exports_as_its_local_twin(tmp_path, s3_server):
    # a Megatron dataset behind s3://: each chunk read by ranged requests, the same bytes as from the mapped file
    seqs = random_sequences(200, seed=9, vocab=70_000)
    (tmp_path / "d").mkdir()
    write_dataset(tmp_path / "d" / "corpus", seqs, np.int32)
    s3_server.bucket("exports")
    s3_server.upload_tree(tmp_path / "d", "s3://exports/d")
    env = {**s3_server.env(), "SORTPACK_TEST_EXPORT_TOKENS": "500"}
    opts = ["--max-tokens", "512", "--quiet"]
    run_sortpack(["run", tmp_path / "d" / "corpus.idx", "-o", tmp_path / "local", *opts], env=env)
    run_sortpack(["run", "s3://exports/d/corpus.idx", "-o", tmp_path / "obj", *opts], env=env, timeout=240)
    for name in ("local", "obj"):
        run_sortpack(["export", tmp_path / name, "--to", "megatron", "-o", tmp_path / f"{name}-x", "--quiet"],
                     env=env, timeout=240)
    assert _read(tmp_path / "obj-x") == _read(tmp_path / "local-x")
    assert _read(tmp_path / "local-x")[0] == [seqs[s].tolist() for s in _planned(tmp_path / "local")]


@pytest.mark.mpi
@pytest.mark.slow
def test_a_guess_written_again_is_the_same_at_1_to_3_ranks(plans, tmp_path):
    if MPIEXEC is None:
        pytest.skip("mpiexec not found")
    _, plan, want = plans
    env = {"SORTPACK_TEST_EXPORT_TOKENS": "50"}  # every rank guesses from its first 50 tokens, many chunks each
    for k in (1, 2, 3):
        run_sortpack(["export", plan, "--to", "megatron", "-o", tmp_path / f"r{k}", "--quiet"], ranks=k, env=env)
    first = _read(tmp_path / "r1")
    assert first[0] == want and first[1] == np.int32
    assert _read(tmp_path / "r2") == first and _read(tmp_path / "r3") == first


def test_an_input_changed_since_the_plan_is_one_line_and_nothing_written(tmp_path):
    from megatron_files import plan_in_process

    seqs = random_sequences(60, seed=4)
    idx = write_dataset(tmp_path / "d", seqs)
    plan = plan_in_process(tmp_path / "p", [idx], max_tokens=400)
    docs = np.arange(len(seqs) + 1)
    docs[1] = 2  # the same sizes and sequences, another document split: the .idx differs in content only
    write_dataset(tmp_path / "d", seqs, documents=docs)
    with pytest.raises(SortpackError, match="content changed since analyze"):
        export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "out" / "x")))
    assert not (tmp_path / "out").exists()
