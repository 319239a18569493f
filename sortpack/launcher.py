"""What the job launcher (mpiexec, mpirun, srun) says about this process, read from its
environment without loading MPI: the one place sortpack looks at PMI_RANK and friends.

The rule (docs/guarantees.md): a launcher variable that is set (not empty) must be an integer (a rank
>= 0, a size >= 1, the rank below the size), and a launcher's size needs its rank; anything
else is one ``LauncherError`` naming the variable, never a silent "rank 0 of 1" that would
make every process train (or write) the whole job. A rank without its size is no launcher.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from .errors import SortpackError

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


# Prefixes of the variables a job launcher or MPI runtime sets in the processes it starts (Hydra, Intel MPI and
# Cray's PMI, PMIx, Open MPI, MVAPICH2, Slurm's steps, Cray PALS and ALPS, Flux, IBM's jsrun): a process
# with none of them set is no launcher's, a job of one rank that needs no MPI library to know it.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MV2_", "HYDRA_", "I_MPI_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID",
                     "SLURM_STEP", "SLURM_PROCID", "PALS_", "ALPS_APP", "FLUX_TASK", "JSM_NAMESPACE")


class LauncherError(SortpackError, ValueError):
    """A launcher variable that is set but wrong: exit status 2 in the CLI, a ValueError in the reader."""


class Launch(NamedTuple):
    """This process's rank and the number of ranks, as the launcher's variables give them."""

    rank: int
    size: int
    rank_var: str
    size_var: str


def env_count(name: str, lowest: int) -> int | None:
    """Return variable ``name`` as an int >= ``lowest`` (None when unset or empty), or raise LauncherError."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return None  # unset, or set empty (as a shell clears a variable)
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < lowest:
        kind = "rank (an integer >= 0)" if lowest == 0 else "number of ranks (an integer >= 1)"
        raise LauncherError(f"the launcher variable {name}={text!r} is not a {kind}; fix or unset it")
    return value


def launcher() -> Launch | None:
    """Return what the launcher's environment says (None: no launcher), or raise LauncherError.

    Every launcher variable that is set must parse; the first pair whose size is set decides.
    """
    values = [(r, s, env_count(r, 0), env_count(s, 1)) for r, s in _PAIRS]
    for rank_var, size_var, rank, size in values:
        if size is None:
            continue  # a rank alone says nothing of the job's size
        if rank is None:
            if size_var.startswith("SLURM"):
                continue  # a batch script's one process, not an srun step
            raise LauncherError(f"the launcher variable {size_var}={size} is set but {rank_var} is not: which "
                                f"rank is this? Set both or neither")
        if rank >= size:
            raise LauncherError(f"the launcher variable {rank_var}={rank} is not below {size_var}={size}")
        return Launch(rank, size, rank_var, size_var)
    return None


def launched() -> str | None:
    """Return a variable of a job launcher (``LAUNCHER_PREFIXES``) set in this process's environment (the first in
    order), or None: a process that no launcher started."""
    for name in sorted(os.environ):
        if name.startswith(LAUNCHER_PREFIXES):
            return name
    return None


def launcher_rank() -> int:
    """Return this process's rank as the launcher's environment gives it (0 when none does)."""
    launch = launcher()
    return 0 if launch is None else launch.rank


def launcher_size() -> tuple[int, str | None]:
    """Return (number of ranks, the variable that says so) from the launcher's environment.

    (1, None) when no launcher variable is set: a plain shell, or a singleton.
    """
    launch = launcher()
    return (1, None) if launch is None else (launch.size, launch.size_var)


# (size variable, the variable giving how many of those ranks share this node) per launcher that sets both
_ON_NODE = {"PMI_SIZE": "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE",
            "MV2_COMM_WORLD_SIZE": "MV2_COMM_WORLD_LOCAL_SIZE"}


def on_one_node() -> bool:
    """Return whether the launcher's environment says every rank of the job runs on this node (True without one).

    False where it does not say (a launcher without a per-node count, Slurm over several nodes)
    or a variable does not parse (``launcher`` reports that later, where the job starts).
    """
    try:
        launch = launcher()
        if launch is None:
            return True  # a plain process: a job of one rank
        if launch.size == 1:
            return True
        if launch.size_var.startswith("SLURM"):
            return env_count("SLURM_STEP_NUM_NODES", 1) == 1
        local_var = _ON_NODE.get(launch.size_var)
        return local_var is not None and env_count(local_var, 1) == launch.size
    except LauncherError:
        return False


def printing_rank() -> int:
    """Return the rank that the launcher's first well-formed pair of variables gives (0 when none does).

    Never raises: it decides which process prints an error found before there is a
    communicator, the launcher's own errors included (printed once, not once per process).
    """
    for rank_var, size_var in _PAIRS:
        try:
            rank, size = env_count(rank_var, 0), env_count(size_var, 1)
        except LauncherError:
            continue
        if rank is not None and size is not None and rank < size:
            return rank
    return 0
