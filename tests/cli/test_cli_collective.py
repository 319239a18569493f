"""inspect and verify under mpiexec print once; a manifest missing keys is one line, not a
traceback, for every command that reads it."""
from __future__ import annotations

import json

import pytest

from support import run_sortpack


@pytest.fixture(scope="module")
def plan(tmp_path_factory, request):
    """A small index with its metrics and sorted directories."""
    from support import write_text_parquet

    d = tmp_path_factory.mktemp("collective")
    write_text_parquet(d / "in.parquet", [(i * 37) % 200 + 1 for i in range(500)], 100)
    run_sortpack(["run", d / "in.parquet", "-o", d / "plan", "--column", "text", "--max-tokens", "1000",
                  "--keep-intermediate", "--quiet"])
    return d


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.mpi
@pytest.mark.slow
def test_inspect_and_verify_under_mpiexec_report_once(plan):
    proc = run_sortpack(["inspect", plan / "plan", "--json"], ranks=2, timeout=60)
    assert json.loads(proc.stdout)["num_samples"] == 500  # one JSON object, not two
    proc = run_sortpack(["verify", plan / "plan"], ranks=2, timeout=60)
    assert lines(proc.stdout) == [f"{plan / 'plan'}: ok"]
    pytest.importorskip("matplotlib")
    proc = run_sortpack(["inspect", plan / "plan", "--plot", plan / "fig.png"], ranks=2, timeout=60)
    assert proc.stdout.count("num_samples") <= 1 and (plan / "fig.png").stat().st_size > 0


@pytest.mark.mpi
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_errors_under_mpiexec_are_one_line(plan, command):
    proc = run_sortpack([command, plan / "nothing-here"], ranks=2, timeout=60, check=False)
    assert proc.returncode == 2
    assert lines(proc.stderr) == [f"Error: {plan / 'nothing-here'}: no such directory"]


@pytest.fixture
def broken(plan, tmp_path):
    """Copies of the plan's directories with one manifest key removed."""
    import shutil

    def make(name: str, key: str, shard_key: str | None = None):
        d = tmp_path / f"{name}-{key}"
        shutil.copytree(plan / name, d)
        m = json.loads((d / "manifest.json").read_text())
        if shard_key:
            del m["shards"][0][shard_key]
        else:
            del m[key]
        (d / "manifest.json").write_text(json.dumps(m))
        return d

    return make


@pytest.mark.parametrize("name, key, command", [
    ("plan", "stats", ["inspect"]),
    ("plan", "num_microbatches", ["inspect", "--json"]),
    ("plan", "shards", ["verify"]),
    ("plan.metrics", "source", ["sort", "-o", "OUT"]),
    ("plan.sorted", "options", ["pack", "-o", "OUT", "--max-tokens", "1000"]),
])
def test_manifest_missing_key_is_one_line(broken, tmp_path, name, key, command):
    d = broken(name, key, None)
    args = [command[0], d, *[str(tmp_path / "out") if a == "OUT" else a for a in command[1:]]]
    proc = run_sortpack(args, check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert lines(proc.stderr) == [f"Error: {d / 'manifest.json'}: missing key {key!r}"]
    assert not (tmp_path / "out").exists()


def test_manifest_shard_missing_key_is_one_line(broken):
    d = broken("plan", "x", "sha256")
    proc = run_sortpack(["verify", d], check=False, timeout=60)
    assert proc.returncode == 2
    assert lines(proc.stderr) == [f"Error: {d / 'manifest.json'}: missing key 'sha256' in shards[0]"]


@pytest.mark.mpi
def test_manifest_missing_key_under_mpiexec(broken):
    d = broken("plan", "stats", None)
    for command in (["inspect"], ["verify"]):
        proc = run_sortpack([*command, d], ranks=2, check=False, timeout=60)
        assert proc.returncode == 2
        assert lines(proc.stderr) == [f"Error: {d / 'manifest.json'}: missing key 'stats'"]


@pytest.fixture
def corrupt(plan, tmp_path):
    """A copy of the plan's index with one byte of a shard flipped (its sha256 no longer matches)."""
    import shutil

    d = tmp_path / "corrupt"
    shutil.copytree(plan / "plan", d)
    shard = d / json.loads((d / "manifest.json").read_text())["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return d


LEAKS = [{"PMI_RANK": "1"}, {"PMI_RANK": "1", "PMI_SIZE": "2"}, {"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}]


@pytest.mark.parametrize("env", LEAKS)
@pytest.mark.slow
def test_a_leaked_launcher_rank_does_not_skip_verify(corrupt, plan, env):
    # a process started by a rank of another job inherits its launcher variables; verify once exited 0
    # on a corrupt index there without checking, and printed no usage error
    proc = run_sortpack(["verify", corrupt], env=env, check=False, timeout=60)
    assert proc.returncode == 1 and "sha256" in proc.stderr, (proc.returncode, proc.stderr)
    proc = run_sortpack(["verify", plan / "plan"], env=env, check=False, timeout=60)
    assert proc.returncode == 0 and lines(proc.stdout) == [f"{plan / 'plan'}: ok"]
    proc = run_sortpack(["inspect", plan / "plan", "--json"], env=env, check=False, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["num_samples"] == 500
    proc = run_sortpack(["verify"], env=env, check=False, timeout=60)
    assert proc.returncode == 2 and lines(proc.stderr) == ["Error: sortpack verify: Missing argument 'DIRECTORY'."]


@pytest.mark.mpi
@pytest.mark.parametrize("command, status", [(["verify", "CORRUPT"], 1), (["verify", "PLAN"], 0),
                                             (["verify", "NOTHING"], 2), (["inspect", "NOTHING"], 2),
                                             (["inspect", "PLAN", "--step", "-1"], 2)])
def test_every_rank_exits_with_the_verdict(corrupt, plan, command, status):
    import os
    import subprocess
    import sys

    from support import MPIEXEC, ROOT

    if MPIEXEC is None:
        pytest.skip("mpiexec not found")
    paths = {"CORRUPT": corrupt, "PLAN": plan / "plan", "NOTHING": plan / "nothing-here"}
    args = " ".join(str(paths.get(a, a)) for a in command)
    # each rank reports its own exit status (mpiexec's own is only the largest)
    script = f'{sys.executable} -m sortpack {args} >/dev/null 2>&1; echo "status $?"'
    proc = subprocess.run([MPIEXEC, "-n", "2", "sh", "-c", script], capture_output=True, text=True, timeout=90,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert sorted(lines(proc.stdout)) == [f"status {status}"] * 2, proc.stdout + proc.stderr
