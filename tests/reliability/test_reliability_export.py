"""An export that fails or is signalled leaves nothing: sortpack export and write/file_outputs.py."""
from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest

from megatron_files import random_sequences, write_dataset
from reliability_support import debris, kill_group, rank_pid, run, start, wait_for_temporary


@pytest.fixture
def plan(tmp_path):
    write_dataset(tmp_path / "corpus", random_sequences(300, seed=2))
    proc = run(["run", "corpus.idx", "-o", "plan", "--max-tokens", "400", "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "plan"


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow
def test_sigterm_removes_the_export_s_temporary(plan, tmp_path, ranks):
    # the last rank stalls once the files are written: at 2 ranks rank 0 waits inside MPI when signalled
    proc = start(["export", "plan", "--to", "megatron", "-o", "out/x", "--quiet"], tmp_path, ranks,
                 {"SORTPACK_FAULT": f"exported:{ranks - 1}:stall"})
    try:
        wait_for_temporary(proc, tmp_path / "out", "x.bin")
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        kill_group(proc)
    assert proc.returncode != 0
    assert re.search(r"terminated by SIGTERM; removed \.x\.bin\.tmp-", err), err
    assert not (tmp_path / "out").exists()  # the directory this job made for it too


@pytest.mark.mpi
@pytest.mark.slow
def test_sigterm_to_rank_1_alone_removes_the_directory_rank_0_made(plan, tmp_path):
    # rank 1 stalls with the files written; the launcher may SIGKILL rank 0 once rank 1 has ended, so rank 1
    # removes the temporary and the output's parent directory that rank 0 created, and says so
    proc = start(["export", "plan", "--to", "megatron", "-o", "out/deeper/x", "--quiet"], tmp_path, 2,
                 {"SORTPACK_FAULT": "exported:1:stall"})
    try:
        wait_for_temporary(proc, tmp_path / "out" / "deeper", "x.bin")
        os.kill(rank_pid(proc.pid, 1), signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode != 0
    assert re.search(r"terminated by SIGTERM; removed \.x\.bin\.tmp-", err), err
    deadline = time.monotonic() + 10  # rank 0 may still be on its way out
    while (tmp_path / "out").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_killed_export_is_swept_by_the_next(plan, tmp_path):
    proc = run(["export", "plan", "--to", "megatron", "-o", "x", "--quiet"], tmp_path,
               env={"SORTPACK_FAULT": "exported:0:kill"})
    assert proc.returncode != 0
    left = debris(tmp_path, "x.bin")
    assert len(left) == 1 and left[0].startswith(".x.bin.tmp-") and not (tmp_path / "x.idx").exists()
    proc = run(["export", "plan", "--to", "megatron", "-o", "x", "--quiet"], tmp_path)
    assert proc.returncode == 0 and f"removed {left[0]}, left by a killed job" in proc.stderr, proc.stderr
    assert debris(tmp_path, "x.bin") == [] and (tmp_path / "x.idx").exists()
    assert np.frombuffer((tmp_path / "x.idx").read_bytes()[:9], np.uint8).tobytes() == b"MMIDIDX\x00\x00"
