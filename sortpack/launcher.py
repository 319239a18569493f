"""What the job launcher (mpiexec, mpirun, srun) says about this process, read from its
environment without loading MPI: the one place sortpack looks at PMI_RANK and friends."""
from __future__ import annotations

import os

# (rank variable, size variable) per launcher, checked in this order: MPICH/Hydra and Intel
# MPI (PMI), Open MPI, PMIx launchers, MVAPICH2, then Slurm's srun (a step's task count;
# SLURM_NTASKS alone is also set in a batch script that runs one process).
_PAIRS = (
    ("PMI_RANK", "PMI_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMIX_RANK", "PMIX_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)


def _int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def launcher_rank() -> int:
    """Return this process's rank as the launcher's environment gives it (0 when none does)."""
    for rank_var, _ in _PAIRS:
        value = _int(rank_var)
        if value is not None:
            return value
    return 0


def launcher_size() -> tuple[int, str | None]:
    """Return (number of ranks, the variable that says so) from the launcher's environment.

    (1, None) when no launcher variable is set: a plain shell, or a singleton.
    """
    for rank_var, size_var in _PAIRS:
        size = _int(size_var)
        if size is not None and (rank_var in os.environ or not rank_var.startswith("SLURM")):
            return size, size_var
    return 1, None
