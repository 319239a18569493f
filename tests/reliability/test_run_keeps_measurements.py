"""``run`` fails fast after analyze and keeps its measurements: OUTPUT.metrics and how to pack from it."""
from __future__ import annotations

import json
import re
import shlex

import pytest

from reliability_support import debris, error_line, make_inputs, run

TINY = ["--column", "text", "--max-tokens", "60"]  # the inputs hold texts of up to 130 characters


def _hinted(line: str) -> list[list[str]]:
    """Return the commands of the error line's `sortpack sort ... && sortpack pack ...` (without the ``...``)."""
    cmd = re.search(r"`(sortpack sort .*?)`", line).group(1).replace(" ...", "")
    return [shlex.split(part)[1:] for part in cmd.split(" && ")]


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow
def test_an_oversize_run_stops_before_the_sort_and_keeps_the_measurements(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    # the sort would crash: the oversize check must come before it
    proc = run(["run", "data", "-o", "plan", *TINY], tmp_path, ranks, env={"SORTPACK_FAULT": "sort:0"})
    line = error_line(proc, "--oversize split")
    assert "kept in plan.metrics" in line, line
    assert not (tmp_path / "plan").exists() and debris(tmp_path, "plan") == []
    metrics = json.loads((tmp_path / "plan.metrics" / "manifest.json").read_text())
    assert metrics["format"] == "sortpack-metrics" and metrics["num_samples"] == 800
    sort, pack = _hinted(line)
    assert run(sort, tmp_path).returncode == 0
    done = run(pack, tmp_path)
    assert done.returncode == 0, done.stderr
    stats = json.loads((tmp_path / "plan" / "manifest.json").read_text())["stats"]
    assert stats["split"] > 0 and stats["tokens"] == metrics["stats"]["size_sum"]  # every character kept


def test_a_crash_in_the_sort_keeps_the_measurements(tmp_path):
    make_inputs(tmp_path / "data")
    proc = run(["run", "data", "-o", "plan", "--column", "text", "--max-tokens", "400"], tmp_path, 2,
               env={"SORTPACK_FAULT": "sort:1"})
    assert proc.returncode != 0
    assert "kept in plan.metrics" in proc.stderr and "sortpack sort plan.metrics" in proc.stderr
    assert run(["verify", "plan.metrics"], tmp_path).returncode == 0
    assert not (tmp_path / "plan").exists()


def test_a_run_that_succeeds_keeps_nothing_and_a_taken_name_is_left_alone(tmp_path):
    make_inputs(tmp_path / "data")
    assert run(["run", "data", "-o", "plan", "--column", "text", "--max-tokens", "400", "--quiet"],
               tmp_path).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "plan"]
    assert not any(p.name.startswith(".") for p in (tmp_path / "plan").iterdir())  # no measurements inside
    mine = tmp_path / "other.metrics"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    line = error_line(run(["run", "data", "-o", "other", *TINY], tmp_path))
    assert "kept in" not in line and (mine / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_a_rerun_that_succeeds_says_the_kept_measurements_are_stale_and_removes_them_with_overwrite(tmp_path):
    make_inputs(tmp_path / "data")
    assert "kept in plan.metrics" in error_line(run(["run", "data", "-o", "plan", *TINY], tmp_path))
    good = ["run", "data", "-o", "plan", "--column", "text", "--max-tokens", "400", "--quiet"]
    proc = run(good, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "sortpack: plan.metrics holds the measurements an earlier run into plan kept, not this plan's; remove it "
        "(or give --overwrite, which removes it)"]
    assert (tmp_path / "plan.metrics").is_dir()
    proc = run([*good, "--overwrite"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == ["sortpack: removed plan.metrics, the measurements an earlier run into "
                                                "plan kept (stale now)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "plan"]
    # a metrics directory of the user's own analyze is no run's: left alone, and nothing said
    assert run(["analyze", "data", "-o", "plan.metrics", "--column", "text", "--quiet"], tmp_path).returncode == 0
    proc = run([*good, "--overwrite"], tmp_path)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr
    assert (tmp_path / "plan.metrics" / "manifest.json").is_file()
