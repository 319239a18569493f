"""Start-up: the CPU each rank spends from its process's start to the first stage, per checkout, alternated.

    PYTHONPATH=$PWD python benchmarks/bench_startup.py --code /work/main --code . [--ranks 2] [--rounds 10]
        [--python ANOTHER_INTERPRETER] [--instructions]

Each round runs ``sortpack run IN -o OUT --column text --max-tokens 4096 --quiet`` (under
``mpiexec -n RANKS`` when ``--ranks`` is over 1) once per ``--code`` checkout (a repository root
first on ``PYTHONPATH``), the checkouts in turn, on 200,000 short texts in one Parquet file.
Every checkout's modules are compiled once first (``compileall``), as an installed package's are:
without it, this environment's ``PYTHONDONTWRITEBYTECODE=1`` makes every process compile each
module from source. Figures from each run's manifest (``provenance.profile``):
``startup_cpu_s`` (the most CPU of any rank to the first stage: other load does not inflate it
the way it inflates wall time), ``startup_s`` (that span's wall) and the whole process's CPU to
the manifest (``cpu_s_per_rank``, the most of any rank): what a lazy import only moves into a
stage shows there. Each line gives the median and the range over the rounds, with the 1-minute
load average around the runs. Goal: a median of at most 0.15 s CPU per rank to the first stage.

The interpreter's own start (``python -c pass``, its CPU, the least of the rounds) is printed
first: the start-up counts it, and on a machine whose site-packages hold ``.pth`` hooks (an
editable install's finder, a certificate hook) it is several times a bare interpreter's.
``--python`` runs every process with another interpreter, e.g. a venv that sees the same
packages without those hooks (``python -m venv --without-pip V`` and a ``.pth`` in its
site-packages that names this one's site-packages directory: a plain path line runs no hook).

Each round also runs the floor under the goal: a process (under ``mpiexec -n RANKS`` when over 1) that
only imports what every run needs before its first stage (numpy, pyarrow, ``pyarrow.parquet``
and click, with the thread settings the command line makes; at more than one rank MPI started and
a barrier, as the command line starts it), its CPU from the process's start (the most of any
rank). The start-up above it is sortpack's own.

CPU time on a loaded machine moves by tens of milliseconds from run to run. ``--instructions``
also counts, once per checkout, the instructions one process executes to the first stage
(valgrind's ``callgrind``, where installed; the process ends where the first stage would
begin): the same from run to run, so two checkouts' imports compare at any load. It does not
see time spent waiting in the kernel (an MPI library spinning on ``sched_yield`` while it
starts), which the CPU figure does.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 0.15
SAMPLES = 200_000


def make_input(directory: Path) -> Path:
    """Return a Parquet file of ``SAMPLES`` short texts of random length (seed 0)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = np.random.default_rng(0).integers(1, 200, SAMPLES)
    chars = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz" * (int(lengths.sum()) // 27 + 1), dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    text = pa.StringArray.from_buffers(SAMPLES, pa.py_buffer(offsets), pa.py_buffer(chars[:offsets[-1]].copy()))
    path = directory / "texts.parquet"
    pq.write_table(pa.table({"text": text}), path)
    return path


def one_run(code: str, data: Path, out: Path, ranks: int, python: str) -> dict:
    """Return one run's start-up figures for checkout ``code`` and the load average just before it."""
    cmd = [python, "-m", "sortpack", "run", str(data), "-o", str(out), "--column", "text",
           "--max-tokens", "4096", "--overwrite", "--quiet"]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    load = os.getloadavg()[0]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(code)}
    # run from the output's directory: a checkout as the working directory would come first on sys.path
    subprocess.run(cmd, env=env, check=True, timeout=300, capture_output=True, cwd=out.parent)
    prof = json.loads((out / "manifest.json").read_text())["provenance"]["profile"]
    return {"cpu": prof["startup_cpu_s"], "wall": prof["startup_s"], "process_cpu": max(prof["cpu_s_per_rank"]),
            "load": load}


# the command line's own start (``python -m sortpack``), ended where the first stage would begin
_TO_FIRST_STAGE = """
import importlib.abc, importlib.machinery, os, sys

class StopAtFirstStage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "sortpack.write.provenance":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            module.Profile.stage = lambda self, name: os._exit(0)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, StopAtFirstStage())
sys.argv = ["sortpack", *sys.argv[1:]]
import runpy
runpy.run_module("sortpack", run_name="__main__")
"""


# what every run imports before its first stage, and MPI's start at more than one rank (the command line's settings)
_FLOOR = """
import os, resource, sys
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")
os.environ.setdefault("UCX_MEM_EVENTS", "no")
import numpy, pyarrow, pyarrow.parquet, click
if int(sys.argv[1]) > 1:
    from mpi4py import MPI
    MPI.COMM_WORLD.Dup().Barrier()
use = resource.getrusage(resource.RUSAGE_SELF)
print(f"cpu={use.ru_utime + use.ru_stime:.6f};")  # marked: the launcher may join two ranks' lines
"""


def floor_cpu(ranks: int, python: str) -> float:
    """Return the most CPU seconds of any rank of a process that only loads what a run needs before its first stage."""
    cmd = [python, "-c", _FLOOR, str(ranks)]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    got = subprocess.run(cmd, check=True, timeout=120, capture_output=True, text=True, cwd=tempfile.gettempdir())
    return max(float(x) for x in re.findall(r"cpu=([0-9.]+);", got.stdout))


def interpreter_cpu(python: str, rounds: int) -> float:
    """Return the least CPU seconds of ``python -c pass`` over ``rounds`` runs: the interpreter's own start."""
    import resource

    best = float("inf")
    for _ in range(max(rounds, 1)):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([python, "-c", "pass"], check=True, timeout=60)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return best


def instructions(code: str, data: Path, out: Path, python: str) -> int | None:
    """Return the instructions one process of checkout ``code`` executes to the first stage (None: no valgrind)."""
    if shutil.which("valgrind") is None:
        return None
    # the interpreter's own binary: a pyenv shim or a venv's link would be what valgrind counts otherwise
    real = subprocess.run([python, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", real, "-c", _TO_FIRST_STAGE,
           "run", str(data), "-o", str(out), "--column", "text", "--max-tokens", "4096", "--overwrite", "--quiet"]
    got = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": os.path.abspath(code)}, capture_output=True,
                         text=True, timeout=600, check=True, cwd=out.parent)
    found = re.search(r"I\s+refs:\s+([\d,]+)", got.stderr)
    return int(found.group(1).replace(",", "")) if found else None


def spread(values: list[float]) -> str:
    """Return the median of ``values`` and their range, in seconds."""
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print, per checkout, the start-up CPU, its wall, the whole CPU per rank and the load."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", action="append", help="a checkout to time (repeatable; default: this one)")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--instructions", action="store_true", help="also count instructions to the first stage")
    ap.add_argument("--python", default=sys.executable, help="the interpreter every process runs (default: this one)")
    args = ap.parse_args(argv)
    codes = args.code or [str(ROOT)]
    bare = interpreter_cpu(args.python, args.rounds)
    for code in codes:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(code) / "sortpack")], check=True,
                       capture_output=True)
    runs: dict[str, list[dict]] = {code: [] for code in codes}
    floors: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = make_input(Path(tmp))
        for code in codes:  # a warm-up run each: the page cache, not the first run, pays for reading the libraries
            one_run(code, data, Path(tmp) / "plan", args.ranks, args.python)
        for _ in range(args.rounds):
            for code in codes:
                runs[code].append(one_run(code, data, Path(tmp) / "plan", args.ranks, args.python))
            floors.append(floor_cpu(args.ranks, args.python))
        counts = ({code: instructions(code, data, Path(tmp) / "plan", args.python) for code in codes}
                  if args.instructions else {})
    print(f"sortpack run, {SAMPLES:,} texts, {args.ranks} rank(s), {args.rounds} alternated rounds; "
          f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"interpreter {args.python}: its own start (python -c pass) {bare:.3f} s CPU, the least of "
          f"{max(args.rounds, 1)}")
    floor = statistics.median(floors) if floors else 0.0
    print(f"floor: numpy, pyarrow, pyarrow.parquet and click{' and MPI started' if args.ranks > 1 else ''} alone "
          f"take {spread(floors)} CPU per rank" if floors else "floor: no rounds")
    for code, got in runs.items():
        cpu = [r["cpu"] for r in got]
        loads = [r["load"] for r in got]
        print(f"{code}: start-up CPU {spread(cpu)}, wall {spread([r['wall'] for r in got])}, whole process CPU "
              f"{spread([r['process_cpu'] for r in got])} per rank, load {min(loads):.1f}-{max(loads):.1f}")
        if counts.get(code) is not None:
            print(f"{code}: {counts[code] / 1e6:,.1f} M instructions to the first stage (one process, callgrind)")
        median = statistics.median(cpu)
        print(f"goal {code}: start-up CPU per rank {median:.3f} s (median), goal <= {GOAL_S} s: "
              f"{'met' if median <= GOAL_S else 'missed'}; sortpack's own, above the floor: {median - floor:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
