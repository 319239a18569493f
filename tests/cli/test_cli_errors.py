"""Bad inputs at the command line: exit status 2, one ``Error:`` line, nothing left on disk."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = shutil.which("mpiexec")


def sortpack_env() -> dict:
    """Return the environment for a sortpack subprocess run from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def sortpack(args, cwd, ranks=None, timeout=60):
    """Run ``python -m sortpack ARGS`` (under ``mpiexec -n ranks`` when given)."""
    cmd = [sys.executable, "-m", "sortpack", *map(str, args)]
    if ranks is not None:
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, cwd=cwd, env=sortpack_env(), capture_output=True, text=True, timeout=timeout)


def assert_clean_failure(proc, tmp_path, out="out", contains=None):
    """Check exit status 2, exactly one non-empty ``Error:`` line, no output and no temporary."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    if contains is not None:
        assert contains in lines[0], lines[0]
    assert not (tmp_path / out).exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{out}.")]
    assert leftovers == [], leftovers


def make_data(d: Path) -> Path:
    """Write small inputs into ``d``: good ones, and one bad in each way."""
    pq.write_table(pa.table({"text": ["ab", "cde", "f"], "n": [1, 2, 3], "d": [0.5, 1.0, 2.0]}),
                   d / "good.parquet", row_group_size=2)
    pq.write_table(pa.table({"text": ["gh", "i"], "n": [4, 5], "d": [1.5, 0.25]}), d / "good2.parquet")
    pq.write_table(pa.table({"text": ["x", None]}), d / "nulls.parquet")
    pq.write_table(pa.table({"text": ["x", "y"], "n": [1, -3]}), d / "negative.parquet")
    pq.write_table(pa.table({"text": ["x", "y"], "d": [1.0, float("nan")]}), d / "nan.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), d / "empty.parquet")
    (d / "data.txt").write_text("text\nabc\n")
    (d / "broken.parquet").write_bytes(b"PAR1 but not really" * 10)
    (d / "emptydir").mkdir()
    return d


@pytest.fixture
def data(tmp_path):
    """A fresh directory of inputs (see make_data)."""
    return make_data(tmp_path)


BAD_ANALYZE = {
    "missing file": (["missing.parquet"], "missing.parquet: no such file or directory"),
    "missing column": (["good.parquet", "--column", "body"], "no column 'body'"),
    "wrong column type": (["good.parquet", "--column", "n"], "column 'n' is int64"),
    "non-numeric column": (["good.parquet", "--size", "column:text"], "not numeric"),
    "nulls": (["nulls.parquet"], "column 'text' has 1 null values"),
    "negative": (["negative.parquet", "--size", "column:n"], "has 1 negative values"),
    "nan": (["nan.parquet", "--column", "text", "--difficulty", "column:d"], "NaN"),
    "empty input": (["empty.parquet"], "holds no rows"),
    "empty directory": (["emptydir"], "directory holds no"),
    "no glob match": (["nothing-*.parquet"], "no file matches"),
    "unknown extension": (["data.txt"], "cannot tell the format"),
    "not parquet": (["broken.parquet"], "cannot read as parquet"),
    "forced wrong format": (["good.parquet", "--input-format", "jsonl"], "cannot read as jsonl"),
    "unknown input format": (["good.parquet", "--input-format", "foo"], "--input-format"),
    "bad size spec": (["good.parquet", "--size", "lenght"], "--size 'lenght'"),
    "bad scale": (["good.parquet", "--size", "column:d*0"], "scale must be a positive number"),
    "bad python spec": (["good.parquet", "--size", "python:nomodule"], "expected python:MODULE:FUNC"),
    "missing python module": (["good.parquet", "--size", "python:sp_no_such_mod:f"], "cannot load"),
    "tokens without tokenizer": (["good.parquet", "--size", "tokens"], "--size tokens needs --tokenizer"),
    "bad tokenizer": (["good.parquet", "--size", "tokens", "--tokenizer", "data.txt"], "cannot load"),
    "unknown option": (["good.parquet", "--max-tokens", "5"], "No such option"),
    "no inputs": ([], "Missing argument"),
    "missing parent, bad input": (["missing.parquet", "-o", "nodir/out"], "no such file or directory"),
    "parent is a file": (["good.parquet", "-o", "good.parquet/out"], "good.parquet is not a directory"),
}




def case_args(command, case):
    """Return the sortpack arguments of one bad case, writing to ``out-<case>``."""
    args, _ = (BAD_ANALYZE if command == "analyze" else BAD_RUN)[case]
    out = case_out(case)
    if command == "run":
        return ["run", "good.parquet", "-o", out, *args]
    return ["analyze", *args, *([] if "-o" in args else ["-o", out])]


def case_out(case):
    """Return the output directory name a case writes to (absent if it fails cleanly)."""
    return "out-" + case.replace(" ", "-")


def _bad_runs(tmp_path_factory, command: str, cases) -> tuple[Path, dict]:
    """Run every bad case of ``command`` at once (they only fail); return (directory, results by case)."""
    d = make_data(tmp_path_factory.mktemp(f"bad-{command}"))
    # subprocesses spend most of their time importing: overlap them
    with ThreadPoolExecutor(max_workers=max(2, 2 * (os.cpu_count() or 1))) as pool:
        procs = dict(zip(cases, pool.map(lambda c: sortpack(case_args(command, c), d, timeout=120), cases)))
    return d, procs


@pytest.fixture(scope="module")
def bad_analyses(tmp_path_factory):
    """Run every bad analyze case (the slow tests': the quick loop runs none of them)."""
    return _bad_runs(tmp_path_factory, "analyze", list(BAD_ANALYZE))


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """Run every bad ``run`` case."""
    return _bad_runs(tmp_path_factory, "run", list(BAD_RUN))


@pytest.mark.parametrize("case", sorted(BAD_ANALYZE))
@pytest.mark.slow
def test_analyze_bad_input(bad_analyses, case):
    d, procs = bad_analyses
    assert_clean_failure(procs[case], d, out=case_out(case), contains=BAD_ANALYZE[case][1])
    assert not (d / "nodir").exists()


BAD_RUN = {
    "budget": (["--max-tokens", "10", "--budget", "foo"], "--budget"),
    "input format": (["--max-tokens", "10", "--input-format", "foo"], "--input-format"),
    "max tokens zero": (["--max-tokens", "0"], "--max-tokens 0"),
    "max tokens negative": (["--max-tokens", "-5"], "--max-tokens -5"),
    "max tokens text": (["--max-tokens", "many"], "--max-tokens"),
    "max tokens missing": ([], "--max-tokens"),
    "quadratic without scale": (["--max-tokens", "10", "--budget", "quadratic"], "--quadratic-scale"),
    "bad column": (["--max-tokens", "10", "--column", "body"], "no column 'body'"),
    "bad key": (["--max-tokens", "10", "--key", "length"], "--key"),
    "oversize": (["--max-tokens", "2"], "max"),
    "measure name": (["--max-tokens", "10", "--measure", "tokens=length"], "--measure"),
    "rows by targets and a second cap": (["--rows", "64", "--size2", "length", "--max-size2", "20", "--balance",
                                          "targets"], "--balance targets composes rows"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_RUN))
def test_run_bad_option(bad_runs, case):
    d, procs = bad_runs
    contains = None if case == "oversize" else BAD_RUN[case][1]
    assert_clean_failure(procs[case], d, out=case_out(case), contains=contains)


def test_existing_output_needs_overwrite(data):
    (data / "out").mkdir()
    (data / "out" / "keep.txt").write_text("mine")
    proc = sortpack(["analyze", "good.parquet", "-o", "out"], data)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("Error: ") and "--overwrite" in lines[0]
    assert (data / "out" / "keep.txt").read_text() == "mine"
    assert [p.name for p in data.iterdir() if p.name.startswith(".out.")] == []


def test_good_input_succeeds(data):
    # the control for the failures above: same files, good options
    proc = sortpack(["analyze", "good.parquet", "good2.parquet", "-o", "out", "--quiet"], data)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((data / "out" / "manifest.json").read_text())
    assert manifest["num_samples"] == 5
    assert [p.name for p in data.iterdir() if p.name.startswith(".out.")] == []


# --- under mpiexec ------------------------------------------------------------------

needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec on PATH")


# two files of two rows: rank 0 reads the first, rank 1 the second (for "negative", the bad one)
MPI_BAD = {"bad column": (["good.parquet", "good2.parquet", "--column", "body"], "no column 'body'"),
           "bad value only on rank one": (["first.parquet", "negative.parquet", "--size", "column:n"],
                                          "negative.parquet: --size column:n has 1 negative values")}


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("case", sorted(MPI_BAD))
@pytest.mark.parametrize("command", ["analyze", "run"])
def test_mpi_bad_input_fails_cleanly(data, command, case):
    pq.write_table(pa.table({"text": ["a", "b"], "n": [1, 2]}), data / "first.parquet")
    args, message = MPI_BAD[case]
    extra = ["--max-tokens", "100"] if command == "run" else []
    proc = sortpack([command, *args, "-o", "out", *extra], data, ranks=2, timeout=120)
    assert_clean_failure(proc, data, contains=message)


@pytest.mark.mpi
@needs_mpi
def test_mpi_bad_option_value(data):
    proc = sortpack(["run", "good.parquet", "-o", "out", "--max-tokens", "10", "--budget", "foo"],
                    data, ranks=2, timeout=120)
    assert_clean_failure(proc, data, contains="--budget")


@pytest.mark.slow
@pytest.mark.mpi
@needs_mpi
def test_mpi_good_input_matches_one_rank(data):
    # the control: the same files succeed, with the one-rank job's content hash
    args = ["analyze", "good.parquet", "good2.parquet", "--quiet"]
    one = sortpack([*args, "-o", "one"], data)
    two = sortpack([*args, "-o", "two"], data, ranks=2, timeout=120)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    hashes = [json.loads((data / d / "manifest.json").read_text())["content_hash"] for d in ("one", "two")]
    assert hashes[0] == hashes[1]


@pytest.mark.mpi
@needs_mpi
def test_mpi_bad_pack_option(data):
    proc = sortpack(["run", "good.parquet", "-o", "out", "--max-tokens", "0"], data, ranks=2, timeout=120)
    assert_clean_failure(proc, data, contains="--max-tokens 0")
