"""Rank from the launcher: a sampler without rank/world size takes this process's share of the job."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sortpack.reader import PackedSampler
from sortpack.reader.world import job_rank, resolve_rank

from reader_fixtures import pipeline_index
from support import ROOT, run_gloo_ranks

WORKER = Path(__file__).with_name("rank_worker.py")
# every variable a launcher may set: cleared so the host's own job does not leak into a test
JOB_VARS = ("RANK", "WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
            "PMIX_RANK", "PMIX_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "SLURM_PROCID",
            "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")


@pytest.fixture
def no_job(monkeypatch):
    for var in JOB_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def plan(tmp_path):
    """An index of 12 micro-batches (4 samples each)."""
    return pipeline_index(tmp_path / "ix", [50] * 48, max_tokens=200, max_samples=4)


def _complementary(shares: list[list[int]], total: int) -> None:
    """Each rank a different share; together every micro-batch exactly once."""
    assert all(shares) and len({tuple(s) for s in shares}) == len(shares)
    assert sorted(mb for s in shares for mb in s) == list(range(total))


LAUNCHERS = {
    "mpiexec (MPICH/Hydra)": ("PMI_RANK", "PMI_SIZE"),
    "Open MPI": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    "srun": ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
    "torchrun": ("RANK", "WORLD_SIZE"),
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_launcher_environment_gives_each_rank_its_share(no_job, plan, launcher):
    rank_var, size_var = LAUNCHERS[launcher]
    shares = []
    for r in range(2):
        no_job.setenv(rank_var, str(r))
        no_job.setenv(size_var, "2")
        if launcher == "srun":
            no_job.setenv("SLURM_NTASKS", "8")  # the allocation's tasks; the step has 2
        s = PackedSampler(plan)
        assert (s.rank, s.world_size) == (r, 2)
        shares.append([mb.microbatch for mb in s])
    _complementary(shares, 12)


def test_no_job_is_rank_0_of_1(no_job, plan):
    assert job_rank() is None
    s = PackedSampler(plan)
    assert (s.rank, s.world_size) == (0, 1)
    assert len(list(s)) == 12
    no_job.setenv("SLURM_NTASKS", "4")  # a batch script's one process is not an srun step
    assert resolve_rank(None, None) == (0, 1)


@pytest.mark.parametrize("given", [dict(rank=0, world_size=2), dict(rank=1, world_size=1), dict(world_size=4),
                                   dict(rank=0)])
def test_an_explicit_value_that_disagrees_with_the_launcher_is_refused(no_job, plan, given):
    no_job.setenv("PMI_RANK", "1")
    no_job.setenv("PMI_SIZE", "2")
    with pytest.raises(ValueError) as err:
        PackedSampler(plan, **given)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("PackedSampler: ") and "PMI_SIZE" in msg and "rank 1 of 2" in msg, msg
    # agreeing values are fine, and check_rank=False looks at another rank's share
    assert PackedSampler(plan, rank=1, world_size=2).rank == 1
    assert PackedSampler(plan, world_size=2).rank == 1
    other = PackedSampler(plan, rank=0, world_size=2, check_rank=False)
    assert (other.rank, other.world_size) == (0, 2)


def test_torchrun_variables_come_before_the_mpi_launchers(no_job, plan):
    # torchrun started under srun: one srun task runs several training processes
    no_job.setenv("SLURM_PROCID", "0")
    no_job.setenv("SLURM_STEP_NUM_TASKS", "1")
    no_job.setenv("RANK", "3")
    no_job.setenv("WORLD_SIZE", "4")
    assert job_rank() == (3, 4, "the environment's RANK/WORLD_SIZE (torchrun)")


def _json_objects(text: str) -> list[dict]:
    """Return every JSON object in ``text``, also where two ranks' lines met without a newline between them."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        obj, end = decoder.raw_decode(text, at)
        found.append(obj)
        at = text.find("{", end)
    return found


def _outputs(outs: list[str]) -> list[dict]:
    return [json.loads([line for line in o.splitlines() if line.startswith("{")][-1]) for o in outs]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("mode", ["plain", "reader", pytest.param("dist", marks=pytest.mark.slow),
                                  pytest.param("mismatch", marks=pytest.mark.slow)])
def test_two_processes_take_complementary_shares(plan, mode):
    pytest.importorskip("torch")
    clean = {v: "" for v in JOB_VARS if v not in ("RANK", "WORLD_SIZE")}
    got = _outputs(run_gloo_ranks([WORKER, plan, mode], ranks=2, timeout=120, env=clean))
    assert [(g["rank"], g["world_size"]) for g in got] == [(0, 2), (1, 2)]
    _complementary([g["microbatches"] for g in got], 12)
    if mode == "mismatch":
        for g in got:
            assert g["error"] is not None and "torch.distributed" in g["error"] and "world_size=3" in g["error"]


@pytest.mark.mpi
def test_under_mpiexec_each_rank_takes_its_share(plan):
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec")
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(WORKER), str(plan), "reader"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = sorted(_json_objects(proc.stdout), key=lambda g: g["rank"])
    assert [(g["rank"], g["world_size"]) for g in got] == [(0, 2), (1, 2)]
    _complementary([g["microbatches"] for g in got], 12)


@pytest.mark.parametrize("env, message", [
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not a rank"),
    ({"RANK": "0", "WORLD_SIZE": "2.0"}, "WORLD_SIZE='2.0' is not a number of ranks"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but RANK is not"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'"),
    ({"SLURM_PROCID": "abc", "SLURM_NTASKS": "2"}, "SLURM_PROCID='abc'"),
    ({"PMI_SIZE": "2"}, "PMI_SIZE=2 is set but PMI_RANK is not"),
    ({"RANK": "0", "WORLD_SIZE": "2", "PMI_RANK": "junk", "PMI_SIZE": "2"}, "PMI_RANK='junk'"),
])
def test_a_launcher_variable_that_does_not_parse_is_one_value_error(no_job, plan, env, message):
    # RANK=abc must not give rank 0 of 1 (every process would train the whole plan), nor a bad MPI or
    # Slurm rank or a size alone rank 0 of 2 (half the plan twice, half never)
    for k, v in env.items():
        no_job.setenv(k, v)
    with pytest.raises(ValueError, match=message) as err:
        PackedSampler(plan)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=message):
        job_rank()
