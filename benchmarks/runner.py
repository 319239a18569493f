"""Launching workers and the sortpack CLI as subprocesses (under mpiexec for P ranks)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .workers import PREFIX

ROOT = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    """A worker failed, timed out or printed no result."""


def bench_env(pin_rayon: bool = True) -> dict:
    """Return the subprocess environment: this checkout on PYTHONPATH, one thread per rank."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                       if p and Path(p).resolve() != ROOT])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("TOKENIZERS_PARALLELISM", None)
    if pin_rayon:
        # the tokenizers library runs a Rayon pool of one thread per core in every rank
        env["RAYON_NUM_THREADS"] = "1"
        env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def mpiexec() -> str:
    """Return the mpiexec to launch multi-rank parts with, or raise BenchError."""
    found = shutil.which("mpiexec")
    if not found:
        raise BenchError("mpiexec not found on PATH (pip install mpich)")
    return found


def launch(cmd: list[str], timeout: float, ranks: int | None = None, pin_rayon: bool = True) -> tuple[float, str]:
    """Run ``cmd`` (under ``mpiexec -n ranks`` when given); return (wall seconds, stdout).

    On timeout the whole process group is killed so no rank outlives the benchmark.
    """
    if ranks is not None:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=bench_env(pin_rayon), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise BenchError(f"timed out after {timeout:.0f} s: {' '.join(cmd[-6:])}") from None
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join((err or out).strip().splitlines()[-8:])
        raise BenchError(f"exit {proc.returncode}: {' '.join(cmd)}\n{tail}")
    return wall, out


def worker(kind: str, args: dict, timeout: float, ranks: int | None = None, pin_rayon: bool = True) -> dict:
    """Run a worker (one plain process, or ``ranks`` under mpiexec); return its JSON result."""
    return timed_worker(kind, args, timeout, ranks, pin_rayon)[1]


def timed_worker(kind: str, args: dict, timeout: float, ranks: int | None = None,
                 pin_rayon: bool = True) -> tuple[float, dict]:
    """Run a worker; return (the whole command's wall seconds, its JSON result)."""
    cmd = [sys.executable, "-m", "benchmarks.workers", kind, json.dumps(args)]
    wall, out = launch(cmd, timeout, ranks, pin_rayon)
    for line in reversed(out.splitlines()):
        if line.startswith(PREFIX):
            return wall, json.loads(line[len(PREFIX):])
    raise BenchError(f"worker {kind} printed no result line")


def sortpack_cli(args: list[str], timeout: float, ranks: int) -> float:
    """Run ``sortpack ARGS`` under ``mpiexec -n ranks``; return the whole command's wall seconds."""
    wall, _ = launch([sys.executable, "-m", "sortpack"] + args, timeout, ranks)
    return wall


def missing_modules(*names: str) -> list[str]:
    """Return the modules of ``names`` this interpreter cannot import (the benchmark then reports itself skipped)."""
    import importlib.util

    return [m for m in names if importlib.util.find_spec(m) is None]


def script_results(ctx, script: Path, out: Path, what: str) -> dict:
    """Return the JSON ``script`` writes to ``out`` when run in a subprocess at the suite's scale."""
    ctx.log(f"{what} at scale {ctx.scale_name}")
    launch([sys.executable, str(script), "--scale", ctx.scale_name, "--json", str(out)],
           900 if ctx.scale_name == "small" else 3600)
    return json.loads(out.read_text())
