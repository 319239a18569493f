"""--overwrite replaces only what sortpack wrote, the swap is atomic,
a terminated or killed job leaves no debris (or the next job removes it), and an unwritable output
fails before any work."""
from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from reliability_support import (
    RUN,
    as_at_a_terminal,
    debris,
    error_line,
    kill_group,
    make_inputs,
    rank_pid,
    run,
    start,
    wait_for_temporary,
)

pytestmark = pytest.mark.mpi


def _tree(d):
    return sorted((str(p.relative_to(d)), p.stat().st_size) for p in d.rglob("*"))


# --- item 1: --overwrite replaces only a sortpack output or an empty directory -----------------

@pytest.mark.parametrize("ranks", [1, 2])
def test_overwrite_refuses_a_project_directory_holding_the_inputs(tmp_path, ranks):
    proj = tmp_path / "proj"
    make_inputs(proj / "data")
    (proj / "NOTES.txt").write_text("my notes")
    before = _tree(proj)
    proc = run(["run", "proj/data", "-o", "proj", "--overwrite", *RUN], tmp_path, ranks)
    error_line(proc, "proj")
    assert _tree(proj) == before
    assert debris(tmp_path, "proj") == []


@pytest.mark.slow
def test_overwrite_refuses_any_directory_sortpack_did_not_write(tmp_path):
    make_inputs(tmp_path / "data")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "NOTES.txt").write_text("keep")
    error_line(run(["run", "data", "-o", "other", "--overwrite", *RUN], tmp_path), "not a sortpack output")
    assert (tmp_path / "other" / "NOTES.txt").read_text() == "keep"
    # a sortpack output into which the user put a file of their own is not replaced either
    run(["run", "data", "-o", "plan", *RUN, "--quiet"], tmp_path).check_returncode()
    (tmp_path / "plan" / "eval.csv").write_text("mine")
    error_line(run(["run", "data", "-o", "plan", "--overwrite", *RUN], tmp_path), "eval.csv")
    assert (tmp_path / "plan" / "eval.csv").read_text() == "mine"
    # a file named as the output is not a directory sortpack wrote
    (tmp_path / "file").write_text("x")
    error_line(run(["run", "data", "-o", "file", "--overwrite", *RUN], tmp_path), "is a file")


@pytest.mark.slow
def test_overwrite_replaces_a_sortpack_output_and_an_empty_directory(tmp_path):
    make_inputs(tmp_path / "data")
    run(["analyze", "data", "-o", "m", "--column", "text", "--quiet"], tmp_path).check_returncode()
    run(["run", "data", "-o", "m", "--overwrite", *RUN, "--quiet"], tmp_path).check_returncode()
    assert json.loads((tmp_path / "m" / "manifest.json").read_text())["format"] == "sortpack-index"
    (tmp_path / "empty").mkdir()
    run(["run", "data", "-o", "empty", "--overwrite", *RUN, "--quiet"], tmp_path).check_returncode()
    assert (tmp_path / "empty" / "manifest.json").is_file()
    assert debris(tmp_path, "m") == debris(tmp_path, "empty") == []


# --- item 10: an unwritable output fails before any work --------------------------------------

MARKER_SPEC = """
import os
import pyarrow.compute as pc

def size(batch):
    open(os.environ["MARKER"], "a").write("measured\\n")
    return pc.utf8_length(batch.column("text"))
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_an_unwritable_output_fails_before_any_work(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    (tmp_path / "marker_spec.py").write_text(MARKER_SPEC)
    marker = tmp_path / "measured.txt"
    if os.geteuid() == 0:
        parent = "/proc"  # root writes through permission bits; not into /proc
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        parent = str(tmp_path / "ro")
    args = ["--size", "python:marker_spec:size", "--max-tokens", "400"]
    proc = run(["run", "data", "-o", f"{parent}/plan", *args], tmp_path, ranks, env={"MARKER": str(marker)})
    error_line(proc, "cannot write the output")
    assert not marker.exists()  # refused before the inputs were measured


@pytest.mark.slow
def test_output_equal_to_or_holding_an_input_or_the_current_directory(tmp_path):
    make_inputs(tmp_path / "data")
    run(["analyze", "data", "-o", "m", "--column", "text", "--quiet"], tmp_path).check_returncode()
    error_line(run(["sort", "m", "-o", "m", "--overwrite"], tmp_path), "is or holds the input")
    error_line(run(["analyze", "data/part-0.parquet", "-o", "data", "--overwrite", "--column", "text"], tmp_path),
               "is or holds the input")
    error_line(run(["run", "data", "-o", ".", "--overwrite", *RUN], tmp_path), "current directory")
    (tmp_path / "sub").mkdir()
    error_line(run(["run", "../data", "-o", "..", "--overwrite", *RUN], tmp_path / "sub"), "current directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "m", "sub"]


# --- item 8: SIGTERM cleans up; the next job removes what SIGKILL left --------------------------

@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow
def test_sigterm_removes_the_temporary_output(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    # the last rank stalls after writing its shards, so at 2 ranks rank 0 waits inside MPI when signalled
    env = {"SORTPACK_FAULT": f"wrote_index:{ranks - 1}:stall"}
    proc = start(["run", "data", "-o", "plan", *RUN, "--quiet"], tmp_path, ranks, env)
    try:
        deadline = time.monotonic() + 60
        while not any(n.startswith(".plan.tmp-") for n in os.listdir(tmp_path)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # the shards are written; the job waits
        os.killpg(proc.pid, signal.SIGTERM)  # as `timeout`, Slurm and scancel do: every process of the job
        _, err = proc.communicate(timeout=30)
    finally:
        kill_group(proc)
    assert proc.returncode != 0
    # the measurements run keeps for a failure go too: a signal is no failure to keep them for
    assert re.search(r"terminated by SIGTERM; removed (\S+, )*\.plan\.tmp-", err), err
    assert debris(tmp_path, "plan") == [] and not (tmp_path / "plan").exists()
    assert debris(tmp_path, "plan.metrics") == [] and not (tmp_path / "plan.metrics").exists()


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_next_job_removes_what_a_killed_job_left(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    proc = run(["run", "data", "-o", "plan", *RUN, "--quiet"], tmp_path, ranks,
               env={"SORTPACK_FAULT": "wrote_index:0:kill"})
    assert proc.returncode != 0
    left = debris(tmp_path, "plan")
    assert len(left) == 1 and left[0].startswith(".plan.tmp-")
    # a live job's temporary (this test process owns it) and a directory sortpack did not name stay
    from sortpack.write.output_guard import owner_tag

    live = tmp_path / f".plan.tmp-{'a' * 12}-{owner_tag()}"
    live.mkdir()
    (tmp_path / ".plan.tmp-mine").mkdir()
    proc = run(["run", "data", "-o", "plan", *RUN, "--quiet"], tmp_path, ranks)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(notes) == 1 and f"removed {left[0]}, left by a killed job" in notes[0], proc.stderr
    assert debris(tmp_path, "plan") == sorted([live.name, ".plan.tmp-mine"])


# --- item 9: the replacement is atomic; the two-rename fallback is recovered ----------------------

def test_exchange_swaps_two_directories_in_one_step(tmp_path):
    from sortpack.write.atomic_rename import exchange, move_new

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("new")
    (b / "y").write_text("old")
    if not exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) unsupported here: the fallback test covers this system")
    assert (b / "x").read_text() == "new" and (a / "y").read_text() == "old"
    with pytest.raises(FileExistsError):
        move_new(a, b)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow
def test_a_kill_between_the_fallback_renames_is_undone_by_the_next_job(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    run(["run", "data", "-o", "plan", *RUN, "--quiet"], tmp_path).check_returncode()
    before = (tmp_path / "plan" / "manifest.json").read_text()
    env = {"SORTPACK_NO_RENAMEAT2": "1", "SORTPACK_FAULT": "between_renames:0:kill"}
    proc = run(["run", "data", "-o", "plan", "--overwrite", *RUN[:-1], "300", "--quiet"], tmp_path, ranks, env=env)
    assert proc.returncode != 0
    assert not (tmp_path / "plan").exists()  # the window that renameat2 closes
    # the next job into the same output (here: any command writing it) restores it first
    # (and removes the complete new output the killed job had not moved in yet)
    proc = run(["run", "data", "-o", "plan", *RUN, "--quiet"], tmp_path, ranks)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines[-1] == "Error: plan: output exists (use --overwrite to replace it)", lines
    assert any(line.startswith("sortpack: restored the previous output plan") for line in lines), lines
    assert len(lines) == 3 and "left by a killed job" in "".join(lines), lines
    assert (tmp_path / "plan" / "manifest.json").read_text() == before
    assert debris(tmp_path, "plan") == []


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_overwrite_with_the_exchange_leaves_one_output_and_no_debris(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    run(["run", "data", "-o", "plan", *RUN, "--quiet"], tmp_path).check_returncode()
    proc = run(["run", "data", "-o", "plan", "--overwrite", *RUN[:-1], "300", "--quiet"], tmp_path, ranks)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "plan" / "manifest.json").read_text())["options"]["max_tokens"] == 300
    assert debris(tmp_path, "plan") == []


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow
def test_ctrl_c_prints_a_sortpack_line_and_removes_the_temporary(tmp_path, ranks):
    # Ctrl-C prints a sortpack line, not only MPI abort lines
    make_inputs(tmp_path / "data")
    proc = start(["run", "data", "-o", "plan", *RUN, "--quiet"], tmp_path, ranks,
                 {"SORTPACK_FAULT": f"wrote_index:{ranks - 1}:stall"})
    try:
        wait_for_temporary(proc, tmp_path, "plan")
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _, err = proc.communicate(timeout=30)
    finally:
        kill_group(proc)
    assert "sortpack: interrupted (Ctrl-C); removed .plan.tmp-" in err, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == (130 if ranks == 1 else proc.returncode) and proc.returncode != 0
    assert debris(tmp_path, "plan") == [] and not (tmp_path / "plan").exists()


def _sortpack_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("sortpack:")]


@pytest.mark.slow
def test_ctrl_c_under_mpiexec_during_store_tokens_is_one_sortpack_line(tmp_path):
    # every rank printed its own line (or, signalled in the start-up, a KeyboardInterrupt traceback)
    from support import make_special_tokenizer

    make_inputs(tmp_path / "data")
    tok = make_special_tokenizer(tmp_path / "tok.json", texts=["abcdefghij " * 3])
    args = ["run", "data", "-o", "plan", "--column", "text", "--size", "tokens", "--tokenizer", tok,
            "--store-tokens", "--max-tokens", "400", "--quiet"]
    # rank 1 stalls after analyze (the temporary holds the token cache), rank 0 waits for it inside MPI
    proc = start(args, tmp_path, 2, {"SORTPACK_FAULT": "after_analyze:1:stall"})
    try:
        wait_for_temporary(proc, tmp_path, "plan")
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: mpiexec forwards it to every rank
        _, err = proc.communicate(timeout=30)
    finally:
        kill_group(proc)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = _sortpack_lines(err)
    assert len(lines) == 1 and lines[0].startswith("sortpack: interrupted (Ctrl-C); removed .plan.tmp-"), err
    assert proc.returncode != 0
    assert debris(tmp_path, "plan") == [] and not (tmp_path / "plan").exists()


_STARTUP = """
import os, sys, time
from sortpack.cli import main, startup
def slow(argv):  # the imports of a job's start-up, held: a Ctrl-C comes while they run
    open(os.path.join(sys.argv[1], "up-%d" % os.getpid()), "w").close()
    time.sleep(60)
startup.skip_pandas = slow
main(["run", "data", "-o", "plan", "--column", "text", "--max-tokens", "400"])
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_ctrl_c_during_the_start_up_is_one_sortpack_line(tmp_path, ranks):
    import subprocess
    import sys

    from support import MPIEXEC, ROOT

    make_inputs(tmp_path / "data")
    (tmp_path / "go.py").write_text(_STARTUP)
    cmd = [sys.executable, str(tmp_path / "go.py"), str(tmp_path)]
    if ranks > 1:
        if MPIEXEC is None:
            pytest.skip("mpiexec not found")
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_at_a_terminal)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("up-*"))) < ranks:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        kill_group(proc)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert _sortpack_lines(err) == ["sortpack: interrupted (Ctrl-C)"], err
    assert proc.returncode != 0 and debris(tmp_path, "plan") == []


@pytest.mark.mpi
@pytest.mark.slow
def test_sigterm_to_one_rank_other_than_0_during_a_mixture_store_leaves_nothing(tmp_path):
    # the temporary is rank 0's to remove, and the launcher may SIGKILL rank 0 first: nothing may be left
    make_inputs(tmp_path / "data")
    proc = start(["run", "--blend", "1 data", "-o", "plan", *RUN, "--store", "text", "--quiet"], tmp_path, 2,
                 {"SORTPACK_FAULT": "wrote_index:1:stall"})
    try:
        wait_for_temporary(proc, tmp_path, "plan")
        os.kill(rank_pid(proc.pid, 1), signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode != 0
    assert "terminated by SIGTERM; removed .plan.tmp-" in err, err
    deadline = time.monotonic() + 10  # rank 0 may still be on its way out
    while debris(tmp_path, "plan") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert debris(tmp_path, "plan") == [] and not (tmp_path / "plan").exists()
