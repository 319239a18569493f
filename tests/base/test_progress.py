"""Progress reporting: the 10 s / 10% rule on a fake clock, the stage hooks, and rank 0 only under mpiexec."""
from __future__ import annotations

import io
import re

import pytest

import sortpack.stages.read_plan as read_plan_mod
from sortpack import progress as progress_mod
from sortpack.parallel import SerialComm
from sortpack.pipeline.dataset import JobInfo, JobOutput, run_all
from sortpack.progress import Display, Progress, configure, phase
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.pack import PackOptions
from sortpack.stages.plan_options import PlanOptions
from sortpack.stages.sort import SortOptions

from support import run_sortpack, write_text_parquet


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def reporter(total, clock, unit="rows", **kw):
    stream = io.StringIO()
    kw.setdefault("delay", 0)
    job_total = kw.pop("job_total", None)
    return Progress("analyze", total, unit, job_total, Display(enabled=True, clock=clock, stream=stream, **kw)), stream


def lines(stream):
    return stream.getvalue().splitlines()


@pytest.fixture
def reporting(monkeypatch):
    """Reporting on for reporters created without ``enabled``; off again afterwards."""
    monkeypatch.setenv("SORTPACK_PROGRESS_DELAY", "0")
    configure(True)
    yield
    configure(False)


def test_a_line_every_ten_percent_when_fast():
    clock = FakeClock()
    p, out = reporter(1000, clock)
    for _ in range(99):
        clock.t += 0.01
        p.update(10, tokens=30)
    # 10%, 20%, ..., 90% (99% is not 10% past 90%)
    assert [re.search(r"(\d+)%", x).group(1) for x in lines(out)] == [str(k) for k in range(10, 100, 10)]
    p.update(10, tokens=30)
    p.close()
    last = lines(out)[-1]
    assert last.startswith("sortpack: analyze done 1.0k rows") and "3.0k tokens" in last
    assert len(lines(out)) == 10  # 100% is said once, by the done line


def test_a_line_every_ten_seconds_when_slow():
    clock = FakeClock()
    p, out = reporter(1_000_000, clock)
    for _ in range(30):
        clock.t += 1.0
        p.update(100)  # 0.01% a second: only the clock triggers lines
    assert len(lines(out)) == 3
    assert lines(out)[0] == "sortpack: analyze 0% 1.0k/1.0M rows, 100 rows/s, eta 2.8 h"
    clock.t += 9.9
    p.update(1)
    assert len(lines(out)) == 3  # 9.9 s since the last line: not yet


def test_line_format_names_rank_zero_share_and_job_total():
    clock = FakeClock()
    p, out = reporter(10_000_000, clock, ranks=4, job_total=40_000_000)
    clock.t += 2.0
    p.update(4_500_000, tokens=3_100_000)
    assert lines(out) == [("sortpack: rank 0 of 4: analyze 45% 4.5M/10.0M rows (job 40.0M), 2.2M rows/s, "
                           "3.1M tokens, eta 2 s")]


def test_a_stage_shorter_than_the_delay_prints_nothing():
    clock = FakeClock()
    p, out = reporter(100, clock, delay=2.0)
    for _ in range(10):
        clock.t += 0.1
        p.update(10)
    p.close()
    assert out.getvalue() == ""
    p, out = reporter(100, clock, delay=2.0)
    clock.t += 3.0
    p.update(50)
    p.close()
    assert len(lines(out)) == 2 and lines(out)[-1].startswith("sortpack: analyze done 50 rows")


def test_disabled_reporter_prints_nothing():
    out = io.StringIO()
    p = Progress("sort", 10, display=Display(enabled=False, stream=out, delay=0))
    p.update(10)
    p.close()
    assert out.getvalue() == ""


def test_phases_go_to_the_open_reporter_and_a_terminal_gets_a_bar():
    clock = FakeClock()
    p, out = reporter(None, clock, interval=5.0, unit="phases")
    phase("local sort")  # counts on p
    clock.t += 6.0
    phase("exchange")
    p.close()
    assert lines(out)[0] == "sortpack: analyze 2 phases, phase exchange"
    assert lines(out)[-1] == "sortpack: analyze done 2 phases, 6.0 s"
    phase("after close")  # no reporter open: nothing happens

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = Progress("pack", 100, "rows", display=Display(enabled=True, stream=tty, delay=0))
    bar.update(50)
    bar.close()
    assert "pack" in tty.getvalue() and "sortpack:" not in tty.getvalue()


def test_every_stage_reports_in_process(tmp_path, reporting, capsys, monkeypatch):
    # four row groups of 250 rows read one at a time: analyze reports within a file
    monkeypatch.setattr(read_plan_mod, "READ_ROWS", 250)
    path = write_text_parquet(tmp_path / "a.parquet", [1 + (i * 37) % 300 for i in range(1000)], 250)
    run_all(SerialComm(), [str(path)],
            PlanOptions(AnalyzeOptions(column="text"), SortOptions(), PackOptions(max_tokens=2000, segment_size=300)),
            JobOutput(str(tmp_path / "plan"), JobInfo(["test"]), progress=True))
    err = capsys.readouterr().err.splitlines()
    assert [x.split("%")[0] for x in err if x.startswith("sortpack: analyze ") and "%" in x] == \
        ["sortpack: analyze 25", "sortpack: analyze 50", "sortpack: analyze 75"]
    done = [x.split(" done")[0] for x in err if " done " in x]
    # run writes no metrics directory when it succeeds (its measurements are dumped raw, unreported)
    assert done == ["sortpack: analyze", "sortpack: sort", "sortpack: pack", "sortpack: write index"]
    assert not progress_mod._current


@pytest.mark.slow
@pytest.mark.mpi
def test_mpiexec_run_reports_from_rank_zero_only(tmp_path, text_dataset):
    files, lengths = text_dataset
    args = ["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500",
            "--segment-size", "300"]
    env = {"SORTPACK_PROGRESS_DELAY": "0", "SORTPACK_TEST_SHARD_ROWS": "100"}
    proc = run_sortpack(args, ranks=2, env=env, timeout=120)
    err = [x for x in proc.stderr.splitlines() if x.startswith("sortpack:")]
    assert err and all(x.startswith("sortpack: rank 0 of 2: ") for x in err), proc.stderr
    done = [x.split(": ", 2)[2].split(" done")[0] for x in err if " done " in x]
    # one done line per stage: a second rank reporting would repeat them
    assert done == ["analyze", "sort", "pack", "write index"], proc.stderr
    assert f"(job {len(lengths) / 1000:.1f}k)" in err[0]
    quiet = run_sortpack(args + ["--quiet", "--overwrite"], ranks=2, env=env, timeout=120)
    assert quiet.stderr.strip() == "" and quiet.stdout.strip() == ""


def test_error_lines_do_not_depend_on_the_machines_load(tmp_path):
    # a test that counts stderr lines failed on a busy machine once analyze passed the 2 s delay
    # every process the suite starts gets a delay no load reaches
    from support import run_sortpack

    proc = run_sortpack(["run", tmp_path / "missing.parquet", "-o", tmp_path / "out", "--column", "text",
                         "--max-tokens", "100"], check=False, env={"PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    import os
    import subprocess
    import sys

    seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('SORTPACK_PROGRESS_DELAY'))"],
                          capture_output=True, text=True, env={**os.environ}, timeout=60).stdout.strip()
    assert seen != "None" and float(seen) >= 600, seen
    from sortpack.progress import _delay

    assert _delay() >= 600
