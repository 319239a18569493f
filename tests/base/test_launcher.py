"""The launcher's environment (sortpack.launcher), a job whose MPI cannot load, and two jobs
racing for one output directory."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sortpack.errors import SortpackError
from sortpack.launcher import LAUNCHER_PREFIXES, launcher_rank, launcher_size, on_one_node
from sortpack.parallel import SerialComm
from sortpack.write.output import OutputDir

from support import ROOT, run_sortpack

LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMIX_SIZE",
                 "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                 "SLURM_STEP_NUM_TASKS", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE",
                 "SLURM_STEP_NUM_NODES")


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("env, rank, size", [
    ({}, 0, 1),
    ({"PMI_RANK": "3", "PMI_SIZE": "4"}, 3, 4),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, 1, 2),
    ({"PMIX_RANK": "2", "PMIX_SIZE": "8"}, 2, 8),
    ({"MV2_COMM_WORLD_RANK": "5", "MV2_COMM_WORLD_SIZE": "6"}, 5, 6),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, 1, 4),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "2"}, 1, 2),
    ({"SLURM_NTASKS": "4"}, 0, 1),  # a batch script's one process, not an srun step
    ({"PMI_RANK": "1"}, 0, 1),  # a rank alone is no launcher
    ({"PMI_RANK": "", "PMI_SIZE": ""}, 0, 1),  # set empty: cleared
])
def test_launcher_rank_and_size(clean_env, env, rank, size):
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert launcher_rank() == rank
    assert launcher_size()[0] == size


@pytest.mark.parametrize("env, one_node", [
    ({}, True),  # a plain process
    ({"PMI_RANK": "0", "PMI_SIZE": "1"}, True),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, True),  # Hydra on one node
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"}, False),  # two nodes
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, False),  # the launcher does not say
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, True),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, False),
    ({"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_LOCAL_SIZE": "2"}, True),
    ({"PMIX_RANK": "0", "PMIX_SIZE": "2"}, False),
    ({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1"}, True),
    ({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2"}, False),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, False),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "two"}, False),  # does not parse: not known
    ({"PMI_RANK": "x", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, False),  # an error the job reports later
])
def test_whether_every_rank_is_on_this_node(clean_env, env, one_node):
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert on_one_node() is one_node


BAD_LAUNCHES = [
    ({"PMI_RANK": "junk", "PMI_SIZE": "2"}, "PMI_RANK='junk' is not a rank"),
    ({"PMI_RANK": "0", "PMI_SIZE": "two"}, "PMI_SIZE='two' is not a number of ranks"),
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'"),
    ({"SLURM_PROCID": "abc", "SLURM_NTASKS": "2"}, "SLURM_PROCID='abc'"),
    ({"PMI_SIZE": "2"}, "PMI_SIZE=2 is set but PMI_RANK is not"),
    ({"PMIX_SIZE": "4"}, "PMIX_SIZE=4 is set but PMIX_RANK is not"),
    ({"MV2_COMM_WORLD_RANK": "-1", "MV2_COMM_WORLD_SIZE": "2"}, "MV2_COMM_WORLD_RANK='-1'"),
    ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "PMI_RANK=2 is not below PMI_SIZE=2"),
    ({"PMI_RANK": "0", "PMI_SIZE": "0"}, "PMI_SIZE='0'"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_PROCID": "abc"}, "SLURM_PROCID='abc'"),  # every set variable
]


@pytest.mark.parametrize("env, message", BAD_LAUNCHES)
def test_a_launcher_variable_that_does_not_parse_is_an_error(clean_env, env, message):
    from sortpack.launcher import LauncherError

    for k, v in env.items():
        clean_env.setenv(k, v)
    for ask in (launcher_rank, launcher_size):
        with pytest.raises(LauncherError, match=message) as err:
            ask()
        assert isinstance(err.value, SortpackError) and isinstance(err.value, ValueError)


@pytest.mark.slow
@pytest.mark.parametrize("env, message, ranks", [
    ({"SLURM_PROCID": "abc", "SLURM_NTASKS": "2"}, "SLURM_PROCID='abc' is not a rank", None),
    ({"SLURM_PROCID": "abc", "SLURM_NTASKS": "2"}, "SLURM_PROCID='abc' is not a rank", 2),
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'", 2),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_SIZE=2 is set but OMPI_COMM_WORLD_RANK is not", None),
])
def test_the_cli_refuses_a_wrong_launcher_variable_with_one_line(tmp_path, text_dataset, env, message, ranks):
    # these must not run as rank 0 of 1 (or of 2), silently
    files, _ = text_dataset
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500"],
                        env=env, ranks=ranks, check=False, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"Error: the launcher variable {message}"), lines
    assert not (tmp_path / "plan").exists()


def test_one_home_for_the_launcher_variables():
    # every other module asks sortpack.launcher instead of reading the variables itself
    found = []
    for path in [*ROOT.glob("sortpack/**/*.py"), *ROOT.glob("examples/*.py"), *ROOT.glob("benchmarks/*.py")]:
        if path.name != "launcher.py" and any(v in path.read_text() for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")):
            found.append(str(path.relative_to(ROOT)))
    assert found == []


@pytest.mark.parametrize("var", ["PMI_FD", "PMI_RANK", "PMIX_NAMESPACE", "OMPI_COMM_WORLD_SIZE", "HYDRA_CONTROL_FD",
                                 "MPI_LOCALNRANKS", "SLURM_STEP_ID", "SLURM_PROCID", "PALS_RANKID", "FLUX_TASK_RANK",
                                 "ALPS_APP_PE", "JSM_NAMESPACE_RANK", "I_MPI_HYDRA_TOPOLIB", "MV2_COMM_WORLD_RANK"])
def test_any_launcher_s_variable_says_a_launcher_started_the_process(var, monkeypatch):
    from sortpack.launcher import launched

    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)
    assert launched() is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # a batch script's own process: no step, no launcher
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert launched() is None
    monkeypatch.setenv(var, "0")
    assert launched() == var


_COMM_KIND = ("import sys; from sortpack.parallel import get_comm; c = get_comm(); "
              "print(type(c).__name__, c.rank, c.size, 'mpi4py' in sys.modules)")


@pytest.mark.parametrize("extra, want", [({}, "SerialComm 0 1 False"), ({"SORTPACK_MPI": "1"}, "MPIComm 0 1 True"),
                                         ({"SORTPACK_MPI": "1", "SORTPACK_NO_MPI": "1"}, "SerialComm 0 1 False")])
def test_a_process_no_launcher_started_runs_one_rank_without_loading_mpi(extra, want):
    """MPI's import and singleton start cost about 0.02 s of a small run's start-up CPU: a plain process needs
    neither to know it is a job of one rank."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k != "SORTPACK_NO_MPI"}
    env = {**env, **extra, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _COMM_KIND], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == want


@pytest.mark.mpi
def test_mpiexec_of_one_rank_loads_mpi():
    import shutil
    import subprocess
    import sys

    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec")
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k != "SORTPACK_NO_MPI"}
    out = subprocess.run([mpiexec, "-n", "1", sys.executable, "-c", _COMM_KIND], capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "MPIComm 0 1 True"


def fake_broken_mpi(tmp_path: Path) -> str:
    """Return a PYTHONPATH whose mpi4py fails to load its MPI library, as on a broken install."""
    fake = tmp_path / "fake"
    (fake / "mpi4py").mkdir(parents=True)
    (fake / "mpi4py" / "__init__.py").write_text("")
    (fake / "mpi4py" / "MPI.py").write_text("raise RuntimeError('cannot load MPI library libmpi.so.12')\n")
    return f"{fake}{os.pathsep}{ROOT}"


@pytest.mark.slow
@pytest.mark.parametrize("env", [{"PMI_RANK": "0", "PMI_SIZE": "2"}, {"OMPI_COMM_WORLD_RANK": "0",
                                                                      "OMPI_COMM_WORLD_SIZE": "4"},
                                  {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}])
def test_several_ranks_without_mpi_fail_with_one_line(tmp_path, text_dataset, env):
    files, _ = text_dataset
    clean = {v: "" for v in LAUNCHER_VARS}
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500"],
                        env={**clean, **env, "PYTHONPATH": fake_broken_mpi(tmp_path)}, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "MPI cannot load" in lines[0], lines
    assert not (tmp_path / "plan").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".plan")]


@pytest.mark.mpi
def test_mpiexec_with_broken_mpi_prints_one_line_and_writes_nothing(tmp_path, text_dataset):
    files, _ = text_dataset
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500"],
                        ranks=2, env={"PYTHONPATH": fake_broken_mpi(tmp_path)}, check=False, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0
    assert len(lines) == 1 and "MPI cannot load" in lines[0], proc.stderr
    assert not (tmp_path / "plan").exists()


def test_commit_rechecks_the_output_at_rename_time(tmp_path):
    comm = SerialComm()
    out = OutputDir(comm, tmp_path / "plan")
    (out.ensure() / "data.arrow").write_bytes(b"mine")
    # another job finished first
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "manifest.json").write_text("{}")
    with pytest.raises(SortpackError, match=r"plan: output appeared while this job ran .*--overwrite"):
        out.commit({"format": "x"})
    assert not out.tmp.exists()
    assert (tmp_path / "plan" / "manifest.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]


def test_commit_does_not_merge_into_an_empty_directory_made_meanwhile(tmp_path):
    out = OutputDir(SerialComm(), tmp_path / "plan")
    out.ensure()
    (tmp_path / "plan").mkdir()
    with pytest.raises(SortpackError, match="output appeared"):
        out.commit({"format": "x"})
    assert not out.tmp.exists()


def test_commit_with_overwrite_replaces_what_appeared(tmp_path):
    out = OutputDir(SerialComm(), tmp_path / "plan", overwrite=True)
    (out.ensure() / "data.arrow").write_bytes(b"mine")
    (tmp_path / "plan").mkdir()  # another job's sortpack output (a user's directory is never replaced)
    (tmp_path / "plan" / "microbatches-00000.arrow").write_bytes(b"theirs")
    (tmp_path / "plan" / "manifest.json").write_text('{"format": "sortpack-index"}')
    out.commit({"format": "x"})
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == ["data.arrow", "manifest.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]


@pytest.mark.slow
def test_two_jobs_racing_for_one_output(tmp_path, text_dataset):
    import subprocess
    import sys

    files, _ = text_dataset
    args = [sys.executable, "-m", "sortpack", "run", *map(str, files), "-o", str(tmp_path / "plan"),
            "--column", "text", "--max-tokens", "1500", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    # one wins; the other fails cleanly, at start-up or at rename time
    assert sorted(code for code, _ in results) == [0, 2], results
    for code, err in results:
        if code:
            lines = [line for line in err.splitlines() if line.strip()]
            assert len(lines) == 1 and "output" in lines[0], err
    assert json.loads((tmp_path / "plan" / "manifest.json").read_text())["num_samples"] == 2100
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".plan")) == []
