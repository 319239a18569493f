"""What the CLI sets up before a job: memory a job frees stays with it for its next arrays where asked (glibc),
MPI starts without UCX's memory hooks on one node, and no garbage collection while the libraries load."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support import ROOT

# in a fresh process: free a 256 MiB array, then print the resident MiB that stayed
_PROBE = """
import numpy as np
from sortpack.cli.startup import keep_freed_memory
kept = keep_freed_memory()
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
before = rss()
a = np.ones(32 << 20, np.int64)
del a
print(kept, rss() - before)
"""


def _probe(**env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**{k: v for k, v in os.environ.items() if k != "SORTPACK_KEEP_MEMORY"},
                              "PYTHONPATH": str(ROOT), **env}, timeout=60).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, /proc")
def test_a_freed_array_stays_for_the_next_one_where_asked():
    kept, stayed = _probe(SORTPACK_KEEP_MEMORY="1")
    assert kept == "True"
    assert stayed > 200  # MiB: the 256 MiB array's pages, ready for the next array without page faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, /proc")
@pytest.mark.parametrize("value", [None, "0"])
def test_by_default_malloc_is_left_alone(value):
    kept, stayed = _probe(**({} if value is None else {"SORTPACK_KEEP_MEMORY": value}))
    assert kept == "False"
    assert stayed < 50  # unmapped when freed, as glibc does by default


def _only_record(monkeypatch, startup) -> None:
    """Keep main() of this test process from changing its malloc, environment and collector (the tests record calls)."""
    for name in ("keep_freed_memory", "skip_memory_hooks", "pause_gc"):
        monkeypatch.setattr(startup, name, lambda: False)


def test_only_the_command_line_process_changes_malloc(monkeypatch):
    # main(argv) called from Python (tests, notebooks) leaves the caller's malloc as it is
    from sortpack import cli
    from sortpack.cli import startup

    calls = []
    _only_record(monkeypatch, startup)
    monkeypatch.setattr(startup, "keep_freed_memory", lambda: calls.append(1) or True)
    try:
        cli.main(["--version"])
    except SystemExit:
        pass
    assert calls == []
    monkeypatch.setattr(sys, "argv", ["sortpack", "--version"])
    try:
        cli.main()
    except SystemExit:
        pass
    assert calls == [1]


@pytest.mark.parametrize("env, expect", [
    ({}, "no"),  # one process
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, "no"),  # every rank on this node
    ({"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"}, None),  # several nodes: UCX as it was
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, None),  # the launcher does not say
    ({"UCX_MEM_EVENTS": "yes"}, "yes"),  # the user's choice
    ({"UCX_MEM_EVENTS": " "}, "no"),  # set empty: unset
])
def test_ucx_memory_hooks_are_off_where_every_rank_is_on_this_node(monkeypatch, env, expect):
    from sortpack.cli.startup import skip_memory_hooks

    for var in ("UCX_MEM_EVENTS", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMIX_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
                "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert skip_memory_hooks() is (expect == "no")
    assert os.environ.get("UCX_MEM_EVENTS") == expect


@pytest.mark.parametrize("setup", ["skip_memory_hooks", "pause_gc"])
def test_only_the_command_line_process_changes_mpi_s_start_and_the_collector(monkeypatch, setup):
    # main(argv) called from Python leaves the caller's environment and garbage collector as they are
    from sortpack import cli
    from sortpack.cli import startup

    calls = []
    _only_record(monkeypatch, startup)
    monkeypatch.setattr(startup, setup, lambda: calls.append(1) or True)
    for argv in (["--version"], None):
        monkeypatch.setattr(sys, "argv", ["sortpack", "--version"])
        try:
            cli.main(argv)
        except SystemExit:
            pass
    assert calls == [1]


def test_the_collector_pauses_while_the_libraries_load_and_resumes_frozen():
    import gc

    from sortpack.cli.startup import pause_gc, resume_gc

    assert gc.isenabled()
    try:
        pause_gc()
        assert not gc.isenabled()
        resume_gc()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        resume_gc()  # once only
        gc.disable()  # a caller's own choice: neither call changes it
        pause_gc()
        resume_gc()
        assert not gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


# a python: SPEC that measures every sample as 1 where this rank's MPI started without UCX's memory hooks
_HOOKS_SPEC = ("import os\n\ndef hooks_off(batch):\n"
               "    return [int(os.environ.get('UCX_MEM_EVENTS') == 'no')] * batch.num_rows\n")


@pytest.mark.parametrize("ranks", [None, pytest.param(2, marks=pytest.mark.mpi)])
def test_a_job_on_one_node_starts_mpi_without_memory_hooks(tmp_path, text_dataset, ranks):
    from support import read_manifest, run_sortpack

    files, _ = text_dataset
    (tmp_path / "sp_hooks_spec.py").write_text(_HOOKS_SPEC)
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "UCX_MEM_EVENTS": ""}
    run_sortpack(["analyze", *files, "-o", tmp_path / "m", "--column", "text", "--size",
                  "python:sp_hooks_spec:hooks_off", "--quiet"], ranks=ranks, env=env)
    stats = read_manifest(tmp_path / "m")["stats"]
    assert stats["size_min"] == stats["size_max"] == 1


def test_pyarrow_loads_without_the_modules_it_loads_for_pandas_and_still_pickles():
    # cloudpickle: about 8 ms of CPU per rank that a job never uses; dateutil and six: about 4 ms. Once the user's
    # code imports dateutil, pyarrow converts its relativedelta as it would have
    code = ("import sys, pickle; from sortpack.cli.startup import skip_pandas; skip_pandas(['run']); "
            "import pyarrow as pa; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'cloudpickle', 'dateutil', 'six'})); "
            "t = pa.table({'a': [1, 2]}); print(pickle.loads(pickle.dumps(t)).equals(t)); "
            "from dateutil.relativedelta import relativedelta; print(pa.array([relativedelta(months=1)]).type)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60).stdout.split()
    assert out == ["[]", "True", "month_day_nano_interval"]


_GC_SPEC = ("import gc\n\ndef collected(batch):\n"
            "    return [int(gc.isenabled() and gc.get_freeze_count() > 0)] * batch.num_rows\n")


def test_a_job_s_stages_run_with_the_collector_on_and_start_up_frozen(tmp_path, text_dataset):
    from support import read_manifest, run_sortpack

    files, _ = text_dataset
    (tmp_path / "sp_gc_spec.py").write_text(_GC_SPEC)
    run_sortpack(["analyze", *files, "-o", tmp_path / "m", "--column", "text", "--size", "python:sp_gc_spec:collected",
                  "--quiet"], env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"})
    stats = read_manifest(tmp_path / "m")["stats"]
    assert stats["size_min"] == stats["size_max"] == 1
