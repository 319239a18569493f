"""The commands as library calls: read and write directories around the three stages.

``run_analyze``, ``run_sort``, ``run_pack`` and ``run_all`` are what the CLI calls; each
is collective (every rank calls it) and returns the written manifest on rank 0.
"""
from __future__ import annotations

import datetime as _dt
import resource
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from . import __version__
from .analyze import AnalyzeOptions, Samples, analyze
from .distribute import global_start, redistribute
from .format.manifest import FORMATS, VERSION, read_manifest
from .format.schemas import index_schema, metrics_schema, schema_json, sorted_schema
from .format.shards import (
    ROWS_PER_SHARD,
    SAMPLES_PER_SHARD,
    OutputDir,
    index_shard_layout,
    owner_starts,
    read_rows,
    write_owned_shards,
)
from .pack import Microbatches, PackOptions, pack_samples
from .parallel import Comm
from .sort import SortOptions, sort_samples


class Profile:
    """Per-stage wall time and Alltoallv bytes of this rank, reduced over ranks at the end."""

    def __init__(self, comm: Comm):
        self.comm = comm
        self.stages: dict[str, dict] = {}
        self.counts: dict[str, int] = {}  # per-rank counts reported for every rank (balance)

    @contextmanager
    def stage(self, name: str):
        """Time the enclosed work as stage ``name``."""
        t0, b0 = time.perf_counter(), self.comm.bytes_sent
        yield
        self.comm.barrier()
        self.stages[name] = {"wall_s": time.perf_counter() - t0, "alltoallv_bytes": self.comm.bytes_sent - b0}

    def reduce(self) -> dict:
        """Return, per stage, the max over ranks of wall time and bytes, and the peak RSS."""
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        parts = self.comm.allgather_obj((self.stages, rss, self.counts))
        out = {}
        for name in self.stages:
            out[name] = {
                "wall_s": round(max(p[0][name]["wall_s"] for p in parts), 4),
                "alltoallv_bytes_max": max(p[0][name]["alltoallv_bytes"] for p in parts),
                "alltoallv_bytes_total": sum(p[0][name]["alltoallv_bytes"] for p in parts),
            }
        out["peak_rss_bytes_max"] = max(p[1] for p in parts)
        out["peak_rss_bytes_per_rank"] = [p[1] for p in parts]
        for name in self.counts:
            out[f"{name}_per_rank"] = [p[2].get(name, 0) for p in parts]
        return out


@dataclass
class JobInfo:
    """What every output records about the job that made it."""

    argv: list[str]


def _provenance(comm: Comm, profile: Profile, job: JobInfo) -> dict:
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


def _sample_stats(comm: Comm, s: Samples) -> dict:
    n = len(s)
    size_sum = comm.allreduce(int(s.size.sum()), "sum")
    smin = comm.allreduce(int(s.size.min()) if n else 2**62, "min")
    smax = comm.allreduce(int(s.size.max()) if n else -1, "max")
    dmin = comm.allreduce(float(s.difficulty.min()) if n else float("inf"), "min")
    dmax = comm.allreduce(float(s.difficulty.max()) if n else float("-inf"), "max")
    stats = {"num_samples": s.total, "size_sum": size_sum, "size_min": smin, "size_max": smax,
             "difficulty_min": dmin, "difficulty_max": dmax}
    if s.stage is not None:
        counts = np.bincount(s.stage.astype(np.int64), minlength=1) if n else np.zeros(1, np.int64)
        width = comm.allreduce(len(counts), "max")
        counts = comm.allreduce(np.pad(counts, (0, width - len(counts))).astype(np.int64), "sum")
        stats["stage_counts"] = [int(c) for c in counts]
    return stats


def write_samples(comm: Comm, out: OutputDir, kind: str, samples: Samples, options: dict,
                  profile: Profile, job: JobInfo) -> dict | None:
    """Write a metrics or sorted directory from this rank's slice; return the manifest on rank 0."""
    rows = ROWS_PER_SHARD[kind]
    dest = owner_starts(samples.total, rows, comm.size)
    cols = redistribute(comm, samples.columns(), samples.start, dest)
    cols.setdefault("difficulty", cols["size"])
    first = int(dest[comm.rank])
    diff_type = pa.float64() if cols["difficulty"].dtype.kind == "f" else pa.int64()
    schema = metrics_schema(diff_type) if kind == "metrics" else sorted_schema(diff_type)
    if kind == "sorted" and "stage" not in cols:
        cols["stage"] = np.zeros(len(cols["sample_id"]), np.int16)

    def make_table(a, b):
        return pa.table({name: cols[name][a:b] for name in schema.names}, schema=schema)

    with profile.stage(f"write_{kind}"):
        shards = write_owned_shards(comm, out, kind, make_table, first, len(cols["sample_id"]),
                                    samples.total, rows)
    stats = _sample_stats(comm, samples)
    prov = _provenance(comm, profile, job)
    manifest = {
        "format": FORMATS[kind], "version": VERSION,
        "num_rows": samples.total, "num_samples": samples.total, "rows_per_shard": rows,
        "schema": schema_json(schema), "options": options,
        "source": {"num_rows": samples.total, "files": samples.files},
        "shards": shards, "stats": stats, "provenance": prov,
    }
    return out.commit(manifest)


def read_samples(comm: Comm, directory: str, expect: str) -> tuple[Samples, dict]:
    """Return this rank's shard-aligned slice of a metrics or sorted directory, and its manifest."""
    manifest = comm.collectively(read_manifest, directory, expect)
    total = manifest["num_rows"]
    starts = owner_starts(total, manifest["rows_per_shard"], comm.size)
    a, b = int(starts[comm.rank]), int(starts[comm.rank + 1])
    table = read_rows(directory, manifest, a, b)
    cols = {name: table.column(name).to_numpy() for name in table.column_names}
    samples = Samples(a, total, cols["sample_id"].astype(np.int64), cols["size"].astype(np.int64),
                      cols["difficulty"], cols.get("stage"), manifest["source"]["files"])
    return samples, manifest


def _owner_offsets(comm: Comm, dest: np.ndarray, first: int, m: int, flat_start: int, local_offsets: np.ndarray,
                   flat_total: int) -> np.ndarray:
    """Return where each owner's first micro-batch starts in a flat per-micro-batch list.

    Only the rank holding that micro-batch knows it; a max-reduction shares it.
    """
    known = np.full(comm.size + 1, -1, dtype=np.int64)
    local = (dest >= first) & (dest < first + m)
    known[local] = flat_start + local_offsets[dest[local] - first]
    known[dest >= dest[-1]] = flat_total  # owners starting at the end own nothing
    return comm.allreduce(known, "max")


def _move_ragged(comm: Comm, values: np.ndarray, lengths: np.ndarray, first: int, dest: np.ndarray) -> np.ndarray:
    """Return the flat values of the micro-batches this rank owns after the move to ``dest``."""
    m = len(lengths)
    offsets = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    flat_start, flat_total = global_start(comm, len(values))
    starts = _owner_offsets(comm, dest, first, m, flat_start, offsets, flat_total)
    return redistribute(comm, {"v": values}, flat_start, starts)["v"]


def _list_array(offsets: np.ndarray, values: np.ndarray, a: int, b: int, value_type) -> pa.Array:
    lo, hi = int(offsets[a]), int(offsets[b])
    return pa.ListArray.from_arrays(pa.array((offsets[a:b + 1] - lo).astype(np.int32)),
                                    pa.array(values[lo:hi], value_type))


def write_index(comm: Comm, out: OutputDir, mbs: Microbatches, options: dict, files: list[dict],
                profile: Profile, job: JobInfo) -> dict | None:
    """Write the index directory from this rank's micro-batches; return the manifest on rank 0."""
    rows = ROWS_PER_SHARD["index"]
    m = len(mbs.offsets) - 1
    # shards cut by sample count and dealt by bytes: every rank writes, whatever the sizes
    shard_starts, dest = index_shard_layout(comm, np.diff(mbs.offsets), mbs.first, mbs.total, rows,
                                            SAMPLES_PER_SHARD)
    ids = _move_ragged(comm, mbs.sample_ids, np.diff(mbs.offsets), mbs.first, dest)
    row_sizes = None
    if mbs.row_sizes is not None:
        row_sizes = _move_ragged(comm, mbs.row_sizes, mbs.columns["batch_size"].astype(np.int64), mbs.first, dest)
    cols = dict(mbs.columns)
    cols["microbatch"] = np.arange(mbs.first, mbs.first + m, dtype=np.int64)
    cols = redistribute(comm, cols, mbs.first, dest)
    offsets = np.concatenate(([0], np.cumsum(cols["num_samples"], dtype=np.int64)))
    schema = index_schema(rows=row_sizes is not None)
    if row_sizes is not None:
        row_offsets = np.concatenate(([0], np.cumsum(cols["batch_size"], dtype=np.int64)))
        # row_splits of a micro-batch: where each of its rows starts in its sample_ids, plus the end
        row_start_in_mb = np.concatenate(([0], np.cumsum(row_sizes, dtype=np.int64)))
    first = int(dest[comm.rank])

    def make_table(a, b):
        data = {}
        for name in schema.names:
            if name == "sample_ids":
                data[name] = _list_array(offsets, ids, a, b, pa.int64())
            elif name == "row_splits":
                # per micro-batch: where each row starts in its sample_ids, then the end
                counts = cols["batch_size"][a:b].astype(np.int64)
                row_starts = row_start_in_mb[int(row_offsets[a]):int(row_offsets[b])]
                rel = row_starts - np.repeat(offsets[a:b], counts)
                values = np.insert(rel, np.cumsum(counts), offsets[a + 1:b + 1] - offsets[a:b])
                list_off = np.concatenate(([0], np.cumsum(counts + 1)))
                data[name] = pa.ListArray.from_arrays(pa.array(list_off.astype(np.int32)),
                                                      pa.array(values.astype(np.int32)))
            else:
                data[name] = pa.array(cols[name][a:b], schema.field(name).type)
        return pa.table(data, schema=schema)

    with profile.stage("write_index"):
        shards = write_owned_shards(comm, out, "index", make_table, first, len(cols["microbatch"]), mbs.total,
                                    rows, samples_in=lambda a, b: offsets[b] - offsets[a], starts=shard_starts)
    prov = _provenance(comm, profile, job)
    manifest = {
        "format": FORMATS["index"], "version": VERSION,
        "num_rows": mbs.total, "num_samples": mbs.stats["num_samples"], "num_microbatches": mbs.total,
        "rows_per_shard": rows, "samples_per_shard": SAMPLES_PER_SHARD, "schema": schema_json(schema),
        "options": options, "source": {"num_rows": int(sum(f["rows"] for f in files)), "files": files},
        "shards": shards, "stats": mbs.stats, "provenance": prov,
    }
    return out.commit(manifest)


def _guarded(outs: OutputDir | list[OutputDir], fn):
    try:
        return fn()
    except BaseException:
        # a collective error leaves every rank here: drop the half-written directories
        for out in outs if isinstance(outs, list) else [outs]:
            out.discard()
        raise


def run_analyze(comm: Comm, inputs: list[str], output: str, aopts: AnalyzeOptions, overwrite: bool,
                job: JobInfo, progress: bool = False) -> dict | None:
    """Measure the inputs and write a metrics directory."""
    out = OutputDir(comm, output, overwrite)
    prof = Profile(comm)

    def work():
        with prof.stage("analyze"):
            samples = analyze(comm, inputs, aopts, progress)
        prof.counts["analyze_rows"] = len(samples)
        return write_samples(comm, out, "metrics", samples, aopts.as_dict(), prof, job)

    return _guarded(out, work)


def run_sort(comm: Comm, metrics: str, output: str, sopts: SortOptions, overwrite: bool,
             job: JobInfo) -> dict | None:
    """Sort a metrics directory into a sorted directory."""
    comm.collectively(sopts.validate)
    out = OutputDir(comm, output, overwrite)
    prof = Profile(comm)

    def work():
        with prof.stage("read"):
            samples, manifest = read_samples(comm, metrics, "metrics")
        with prof.stage("sort"):
            ordered = sort_samples(comm, samples, sopts, ROWS_PER_SHARD["sorted"], consume=True)
        options = {**manifest["options"], **sopts.as_dict()}
        return write_samples(comm, out, "sorted", ordered, options, prof, job)

    return _guarded(out, work)


def run_pack(comm: Comm, sorted_dir: str, output: str, popts: PackOptions, overwrite: bool,
             job: JobInfo) -> dict | None:
    """Pack a sorted directory into an index directory."""
    comm.collectively(popts.validate)
    out = OutputDir(comm, output, overwrite)
    prof = Profile(comm)

    def work():
        with prof.stage("read"):
            samples, manifest = read_samples(comm, sorted_dir, "sorted")
        key = manifest["options"].get("key", "size")
        with prof.stage("pack"):
            mbs = pack_samples(comm, samples, popts, key)
        options = {**manifest["options"], **popts.as_dict()}
        return write_index(comm, out, mbs, options, manifest["source"]["files"], prof, job)

    return _guarded(out, work)


def run_all(comm: Comm, inputs: list[str], output: str, aopts: AnalyzeOptions, sopts: SortOptions,
            popts: PackOptions, overwrite: bool, job: JobInfo, keep_intermediate: bool = False,
            progress: bool = False) -> dict | None:
    """Analyze, sort and pack in one job (no intermediate files unless asked)."""
    comm.collectively(sopts.validate)
    comm.collectively(popts.validate)
    out = OutputDir(comm, output, overwrite)
    extra = []
    if keep_intermediate:
        extra = [OutputDir(comm, f"{output}.metrics", overwrite), OutputDir(comm, f"{output}.sorted", overwrite)]
    prof = Profile(comm)

    def work():
        with prof.stage("analyze"):
            samples = analyze(comm, inputs, aopts, progress)
        prof.counts["analyze_rows"] = len(samples)
        if keep_intermediate:
            write_samples(comm, extra[0], "metrics", samples, aopts.as_dict(), prof, job)
        with prof.stage("sort"):
            ordered = sort_samples(comm, samples, sopts, ROWS_PER_SHARD["sorted"], consume=True)
        del samples
        options = {**aopts.as_dict(), **sopts.as_dict()}
        if keep_intermediate:
            write_samples(comm, extra[1], "sorted", ordered, options, prof, job)
        with prof.stage("pack"):
            mbs = pack_samples(comm, ordered, popts, sopts.key)
        files = ordered.files
        del ordered
        return write_index(comm, out, mbs, {**options, **popts.as_dict()}, files, prof, job)

    return _guarded([out, *extra], work)
