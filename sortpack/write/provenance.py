"""What every manifest records about the job that wrote it: per-stage profile, host, versions, argv."""
from __future__ import annotations

import datetime as _dt
import os
import resource
import socket
import sys
import time
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from .. import __version__
from ..parallel import Comm
from ..progress import phase_times


def process_age() -> float | None:
    """Return the seconds since this process started (Linux ``/proc``; None where unknown)."""
    try:
        with open("/proc/self/stat") as f:
            # fields after the parenthesised command name; starttime is field 22 of the stat line
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


class Profile:
    """Per-stage wall time and phases, Alltoallv bytes and start-up of this rank, reduced over ranks at the end."""

    def __init__(self, comm: Comm):
        self.comm = comm
        self.stages: dict[str, dict] = {}
        self.counts: dict[str, int] = {}  # per-rank counts reported for every rank (balance)
        self.startup_s: float | None = None  # process start to the first stage's start
        self.startup_cpu_s = 0.0  # CPU time spent by then (what start-up costs without other load)
        self.first_stage: float | None = None  # perf_counter at the first stage's start

    @contextmanager
    def stage(self, name: str):
        """Time the enclosed work as stage ``name``, with the phases it marks (``progress.phase``)."""
        if self.startup_s is None:
            self.startup_s, self.startup_cpu_s = process_age(), time.process_time()
        t0, b0 = time.perf_counter(), self.comm.bytes_sent
        if self.first_stage is None:
            self.first_stage = t0
        with phase_times() as phases:
            yield
        self.comm.barrier()
        self.stages[name] = {"wall_s": time.perf_counter() - t0, "alltoallv_bytes": self.comm.bytes_sent - b0,
                             "phases": phases}

    def _outside(self) -> tuple[float | None, float | None, float]:
        """Return (seconds since the first stage began not in any stage, seconds since the process began, CPU s)."""
        age = process_age()
        if self.first_stage is None:
            return None, age, time.process_time()
        staged = sum(st["wall_s"] for st in self.stages.values())
        return max(time.perf_counter() - self.first_stage - staged, 0.0), age, time.process_time()

    def reduce(self) -> dict:
        """Return, per stage, the max over ranks of wall time and bytes, the peak RSS, and the rest of the wall.

        Every second from the process's start to this call is in ``startup_s``, a stage, or
        ``outside_stages_s`` (work between stages: option checks, statistics, this reduce);
        ``process_s`` is that whole span and ``cpu_s`` its CPU time. What follows (the manifest's
        write and rename, the process's exit) is the launcher's wall minus ``process_s``.
        """
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        outside = self._outside()
        parts = self.comm.allgather_obj((self.stages, rss, self.counts, self.startup_s, self.startup_cpu_s, outside))
        out: dict[str, Any] = {}
        for name in self.stages:
            out[name] = {
                "wall_s": round(max(p[0][name]["wall_s"] for p in parts), 4),
                "alltoallv_bytes_max": max(p[0][name]["alltoallv_bytes"] for p in parts),
                "alltoallv_bytes_total": sum(p[0][name]["alltoallv_bytes"] for p in parts),
            }
            phases = [ph for p in parts for ph in p[0][name]["phases"]]
            if phases:
                # max over ranks per phase: a rank waiting in a collective shows where the slowest one was
                out[name]["phases"] = {ph: round(max(p[0][name]["phases"].get(ph, 0.0) for p in parts), 4)
                                       for ph in dict.fromkeys(phases)}
        if all(p[3] is not None for p in parts) and self.stages:
            out["startup_s"] = round(max(p[3] for p in parts), 3)
            out["startup_s_per_rank"] = [round(p[3], 3) for p in parts]
            out["startup_cpu_s"] = round(max(p[4] for p in parts), 3)
        if all(p[5][0] is not None for p in parts) and all(p[5][1] is not None for p in parts):
            out["outside_stages_s"] = round(max(p[5][0] for p in parts), 3)
            out["process_s"] = round(max(p[5][1] for p in parts), 3)
            out["cpu_s_per_rank"] = [round(p[5][2], 3) for p in parts]
        out["peak_rss_bytes_max"] = max(p[1] for p in parts)
        out["peak_rss_bytes_per_rank"] = [p[1] for p in parts]
        for name in self.counts:
            out[f"{name}_per_rank"] = [p[2].get(name, 0) for p in parts]
        return out


class JobInfo(NamedTuple):
    """What every output records about the job that made it."""

    argv: list[str]


def provenance(comm: Comm, profile: Profile, job: JobInfo) -> dict:
    """Return the manifest's ``provenance`` object (collective: reduces the profile over ranks)."""
    prof = profile.reduce()
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "world_size": comm.size,
        "sortpack_version": __version__,
        "python": sys.version.split()[0],
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "argv": job.argv,
        "profile": prof,
    }


def encoder_provenance(options: dict) -> dict:
    """Return ``{"tokenizers": {file name: record}}``: which encoder gave the token ids of a plan whose ``options``
    name a tokenizer (``inputs.fast_tokens.encoder_provenance``); ``{}`` where they name none: that job loaded no
    tokenizer, and the tokenizer path is not loaded for it here either."""
    if not options.get("tokenizer"):
        return {}
    from ..inputs.fast_tokens import encoder_provenance as chosen

    return chosen(options)
