"""Which data-parallel rank this process is: ``torch.distributed`` when initialised, else the launcher.

A sampler built without ``rank``/``world_size`` asks here, so under ``torchrun``, ``mpiexec``
or ``srun`` every process takes its own share of the plan instead of all being rank 0 of 1.
An explicit value that disagrees with what the job says is refused: it would make ranks
train on overlapping or missing data without any other sign. torch is never imported
here: an initialised process group implies ``torch.distributed`` was imported already.
"""
from __future__ import annotations

import sys
from typing import NamedTuple

from ..launcher import LauncherError, env_count, launcher


class JobRank(NamedTuple):
    """This process's rank, the number of ranks, and what said so (for messages)."""

    rank: int
    world_size: int
    source: str


def job_rank(group=None) -> JobRank | None:
    """Return this process's rank as the job defines it, or None when nothing defines one.

    In order: ``torch.distributed`` when initialised (of ``group`` when given), torchrun's
    ``RANK``/``WORLD_SIZE``, then the MPI or Slurm launcher's variables (``sortpack.launcher``).
    A variable that is set but does not parse, a size without its rank, or a rank not below its
    size raises ``LauncherError`` (a ValueError) naming it: guessing "rank 0 of 1" would make
    every process train on the whole plan.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        what = "torch.distributed" if group is None else "torch.distributed (the given group)"
        return JobRank(dist.get_rank(group), dist.get_world_size(group), what)
    if group is not None:
        raise ValueError("group= needs an initialised torch.distributed process group")
    rank, size = env_count("RANK", 0), env_count("WORLD_SIZE", 1)
    launch = launcher()  # checked even when torchrun's variables decide
    if size is not None:
        if rank is None:
            raise LauncherError(f"the launcher variable WORLD_SIZE={size} is set but RANK is not: which rank is "
                                "this? Set both or neither")
        if rank >= size:
            raise LauncherError(f"the launcher variable RANK={rank} is not below WORLD_SIZE={size}")
        return JobRank(rank, size, "the environment's RANK/WORLD_SIZE (torchrun)")
    if launch is not None:
        return JobRank(launch.rank, launch.size, f"the launcher's environment ({launch.size_var})")
    return None


def resolve_rank(rank: int | None, world_size: int | None, group=None, check: bool = True,
                 what: str = "the sampler") -> tuple[int, int]:
    """Return (rank, world_size): explicit values, the job's where left out, (0, 1) without a job.

    With ``check``, an explicit value that differs from the job's raises ValueError (one line
    naming both). ``check=False`` takes explicit values as given: another rank's view, or a
    data-parallel group inside a larger job without a torch process group to pass.
    """
    job = job_rank(group) if (check or rank is None or world_size is None) else None
    if job is None:
        return (0 if rank is None else int(rank), 1 if world_size is None else int(world_size))
    if check and ((rank is not None and int(rank) != job.rank)
                  or (world_size is not None and int(world_size) != job.world_size)):
        given = ", ".join(f"{k}={v}" for k, v in (("rank", rank), ("world_size", world_size)) if v is not None)
        raise ValueError(f"{what}: {given} disagrees with {job.source}, which says rank {job.rank} of "
                         f"{job.world_size}; leave rank and world_size out to take the job's, pass group= "
                         f"(the data-parallel process group) inside a larger job, or check_rank=False "
                         f"to view another rank's share")
    return (job.rank if rank is None else int(rank), job.world_size if world_size is None else int(world_size))
