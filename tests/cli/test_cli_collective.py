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


@pytest.mark.parametrize("name, key, shard_key, command", [
    ("plan", "stats", None, ["inspect"]),
    ("plan", "num_microbatches", None, ["inspect", "--json"]),
    ("plan", "shards", None, ["verify"]),
    ("plan.metrics", "source", None, ["sort", "-o", "OUT"]),
    ("plan.sorted", "options", None, ["pack", "-o", "OUT", "--max-tokens", "1000"]),
])
def test_manifest_missing_key_is_one_line(broken, tmp_path, name, key, shard_key, command):
    d = broken(name, key, shard_key)
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
