"""Helpers of the reliability suite: run sortpack as a user would and check that a failure is clean."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from support import ROOT, sortpack_cmd


def run(args, cwd: Path, ranks: int | None = None, env: dict | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess:
    """Run ``sortpack ARGS`` in ``cwd`` (under ``mpiexec -n ranks`` when given); never raise on failure."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(sortpack_cmd(list(args), ranks if ranks and ranks > 1 else None), cwd=str(cwd),
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess, contains: str | None = None) -> str:
    """Return the one ``Error:`` line of a failed run after checking exit status 2 and nothing else on stderr."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr[-3000:]
    if contains is not None:
        assert contains in lines[0], lines[0]
    return lines[0]


def debris(directory: Path, name: str) -> list[str]:
    """Return the temporaries of output ``name`` left in ``directory``."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f".{name}."))


def make_inputs(d: Path, n: int = 400) -> Path:
    """Write two small parquet files of text into ``d`` and return ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    for k in range(2):
        texts = ["abcdefghij"[: (i * 7 + k) % 10 + 1] * ((i % 13) + 1) for i in range(n)]
        pq.write_table(pa.table({"text": texts}), d / f"part-{k}.parquet", row_group_size=100)
    return d


RUN = ["--column", "text", "--max-tokens", "400"]


def as_at_a_terminal() -> None:
    """Give a started job Ctrl-C as a terminal's foreground job has it (``preexec_fn``).

    A test run launched in the background of a shell without job control inherits SIGINT
    ignored, and an ignored signal stays ignored across exec: the job would never see the Ctrl-C
    a test sends it.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args, cwd: Path, ranks: int, env: dict) -> subprocess.Popen:
    """Start ``sortpack ARGS`` in the background in its own process group, Ctrl-C as at a terminal."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen(sortpack_cmd(list(args), ranks if ranks > 1 else None), cwd=str(cwd), env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_at_a_terminal)


def wait_for_temporary(proc: subprocess.Popen, folder: Path, name: str) -> None:
    """Wait until a job's temporary ``.NAME.tmp-*`` is in ``folder`` (made by then or not), then a second more (the
    job has written there and waits at its fault point); fail at once if the job ends first, or after 90 s."""
    deadline = time.monotonic() + 90
    while not any(folder.glob(f".{name}.tmp-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    time.sleep(1.0)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of a started job (its whole process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


PYTHON = sys.executable


def rank_pid(launcher: int, rank: int) -> int:
    """Return the pid of ``rank`` started by mpiexec ``launcher`` (hydra puts each rank in its own session)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass

    def descends(pid: int) -> bool:
        while pid > 1:
            if pid == launcher:
                return True
            pid = parents.get(pid, 0)
        return False

    for pid in parents:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"sortpack" in cmd and f"PMI_RANK={rank}".encode() in env and descends(pid):
            return pid
    raise AssertionError(f"no rank {rank} under mpiexec {launcher}")
