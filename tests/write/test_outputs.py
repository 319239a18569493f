"""Output paths: ``-o a/b/plan`` creates missing parents for every command, only once the job
writes, and a failed job removes the parents it created."""
from __future__ import annotations

import json
import os

import pytest

from sortpack.parallel import SerialComm
from sortpack.write.output import OutputDir

from support import run_sortpack


@pytest.mark.slow
def test_every_command_creates_missing_parents(tmp_path, text_dataset):
    files, lengths = text_dataset
    out = tmp_path / "runs" / "today"
    run_sortpack(["analyze", *files, "-o", out / "m" / "metrics", "--column", "text", "--quiet"])
    run_sortpack(["sort", out / "m" / "metrics", "-o", out / "s" / "sorted", "--quiet"])
    run_sortpack(["pack", out / "s" / "sorted", "-o", out / "p" / "plan", "--max-tokens", "1500", "--quiet"])
    run_sortpack(["run", *files, "-o", out / "r" / "x" / "plan", "--column", "text", "--max-tokens", "1500",
                  "--keep-intermediate", "--quiet"])
    for d in ("m/metrics", "s/sorted", "p/plan", "r/x/plan", "r/x/plan.metrics", "r/x/plan.sorted"):
        assert json.loads((out / d / "manifest.json").read_text())["num_samples"] == len(lengths), d
    pytest.importorskip("matplotlib")
    run_sortpack(["inspect", out / "p" / "plan", "--plot", tmp_path / "figs" / "a" / "plan.png"])
    assert (tmp_path / "figs" / "a" / "plan.png").stat().st_size > 0


def test_a_failed_job_creates_no_parents(tmp_path, text_dataset):
    files, _ = text_dataset
    (tmp_path / "kept").mkdir()
    # a failure before anything was measured leaves nothing, not even the parents it made
    proc = run_sortpack(["run", *files, "-o", tmp_path / "kept" / "new" / "deeper" / "plan", "--column", "text",
                         "--size", "tokens", "--max-tokens", "5"], check=False)
    assert proc.returncode == 2, proc.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name != "kept" and not p.name.endswith(".parquet")] == []
    assert list((tmp_path / "kept").iterdir()) == []
    # a failure after analyze keeps the measurements (and the parents that hold them), nothing else
    proc = run_sortpack(["run", *files, "-o", tmp_path / "kept" / "new" / "deeper" / "plan", "--column", "text",
                         "--max-tokens", "5"], check=False)
    assert proc.returncode == 2, proc.stderr
    assert [p.name for p in (tmp_path / "kept" / "new" / "deeper").iterdir()] == ["plan.metrics"]


def test_discard_removes_only_parents_it_made_while_empty(tmp_path):
    out = OutputDir(SerialComm(), tmp_path / "a" / "b" / "plan")
    assert not (tmp_path / "a").exists()  # nothing is created before the job writes
    out.ensure()
    assert out.tmp.parent == tmp_path / "a" / "b"
    out.discard()
    assert list(tmp_path.iterdir()) == []
    out = OutputDir(SerialComm(), tmp_path / "a" / "b" / "plan")
    out.ensure()
    (tmp_path / "a" / "other").write_text("someone else's")
    out.discard()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["other"]


def test_a_killed_job_not_yet_reaped_counts_as_dead(tmp_path):
    # SIGKILLed, its parent has not waited for it yet: a zombie, its pid still taken; the next job removes its temporary
    import signal
    import subprocess
    import sys
    import time

    from sortpack.write.output_guard import _host, _start_time, sweep_stale

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tmp = tmp_path / f".plan.tmp-{'b' * 12}-{proc.pid}-{_start_time(proc.pid)}@{_host()}"
        tmp.mkdir()
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        lines = sweep_stale(tmp_path / "plan")
        assert lines == [f"sortpack: removed {tmp}, left by a killed job (pid {proc.pid})"] and not tmp.exists()
    finally:
        proc.kill()
        proc.wait()
