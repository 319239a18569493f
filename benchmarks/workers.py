"""Benchmark workers: ``python -m benchmarks.workers KIND 'JSON ARGS'``, alone or under mpiexec.

Each times only the work itself (barrier, work, barrier; max over ranks; best of
``repeats``) and prints one line ``BENCH_JSON {...}`` on rank 0 for the driver to parse.
"""
from __future__ import annotations

import os

# one thread per rank, as sortpack's CLI does (set before numpy loads)
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from . import baselines, data  # noqa: E402

PREFIX = "BENCH_JSON "


class _World:
    """mpi4py's world when launched by mpiexec, else a one-rank stand-in."""

    def __init__(self):
        from mpi4py import MPI

        self.mpi = MPI.COMM_WORLD
        self.rank, self.size = self.mpi.Get_rank(), self.mpi.Get_size()

    def span(self, n: int) -> tuple[int, int]:
        """Return this rank's slice ``[a, b)`` of ``n`` global rows."""
        return (self.rank * n) // self.size, ((self.rank + 1) * n) // self.size

    def timed(self, fn, repeats: int, setup=None) -> tuple[float, object]:
        """Return (best over repeats of the max-over-ranks wall time of ``fn(setup())``, last result).

        ``setup`` (untimed) gives each repeat fresh inputs: sortpack sorts some in place.
        """
        best, out = float("inf"), None
        for _ in range(repeats):
            out = None  # free the previous result before the next run
            arg = setup() if setup else None
            self.mpi.Barrier()
            t0 = time.perf_counter()
            out = fn(arg) if setup else fn()
            self.mpi.Barrier()
            dt = self.mpi.allreduce(time.perf_counter() - t0, op=_max())
            best = min(best, dt)
        return best, out


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _best(fn, repeats: int) -> tuple[float, object]:
    """Return (best wall time over ``repeats`` of ``fn()`` in this process, last result)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        out = None
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _sorted_across(w: _World, first, last, count: int, local_ok: bool) -> bool:
    """Return whether every rank's run is sorted and runs follow each other in rank order."""
    ends = w.mpi.allgather((first, last, count, bool(local_ok)))
    chain = [(a, b) for a, b, c, _ in ends if c]
    return all(e[3] for e in ends) and all(chain[i][1] <= chain[i + 1][0] for i in range(len(chain) - 1))


def sort_sortpack(a: dict) -> dict:
    """Time ``sortpack.stages.sample_sort.sample_sort`` on packed uint64 records (``total`` over ranks)."""
    from sortpack.parallel import MPIComm
    from sortpack.stages.key_codes import KeyLayout
    from sortpack.stages.sample_sort import SortHints, sample_sort

    w = _World()
    comm = MPIComm(w.mpi)
    total = a["total"]
    lo, hi = w.span(total)
    keys = data.packed_keys(lo, hi, total)
    bits = data.id_bits(total)
    layout = KeyLayout(64 - bits, id_bits=bits)  # the keys' low bits are the ids
    secs, out = w.timed(lambda k: sample_sort(comm, k, None, {}, SortHints((lo, layout))).hi, a["repeats"], keys.copy)
    ok = bool(np.all(out[1:] >= out[:-1]))
    ok = _sorted_across(w, int(out[0]) if len(out) else 0, int(out[-1]) if len(out) else 0, len(out), ok)
    n_out = w.mpi.allreduce(len(out))
    return {"seconds": secs, "records": total, "sorted": ok and n_out == total,
            "alltoallv_bytes_max": w.mpi.allreduce(comm.bytes_sent // max(a["repeats"], 1), op=_max())}


def sort_stage(a: dict) -> dict:
    """Time ``sortpack.stages.sort.sort_samples`` (the whole stage: payload, redistribution)."""
    from sortpack.format.kinds import rows_per_shard
    from sortpack.parallel import MPIComm
    from sortpack.stages.samples import SampleColumns
    from sortpack.stages.sort import SortOptions, sort_samples

    w = _World()
    comm = MPIComm(w.mpi)
    total = a["total"]
    lo, hi = w.span(total)
    size = data.sizes_range(lo, hi)
    ids = np.arange(lo, hi, dtype=np.int64)
    secs, out = w.timed(lambda smp: sort_samples(comm, smp, SortOptions(), rows_per_shard("sorted")),
                        a["repeats"], lambda: _fresh_samples(SampleColumns, lo, total, ids, size))
    return {"seconds": secs, "records": total,
            "alltoallv_bytes_max": w.mpi.allreduce(comm.bytes_sent // max(a["repeats"], 1), op=_max())}


def _fresh_samples(cls, lo: int, total: int, ids: np.ndarray, size: np.ndarray):
    """Return new SampleColumns over copies (difficulty = size, the default key), for one repeat."""
    fresh = size.copy()
    return cls(lo, total, ids.copy(), fresh, fresh)


def sort_published(a: dict) -> dict:
    """Time the published Python-list sample sort on the same records."""
    w = _World()
    total = a["total"]
    lo, hi = w.span(total)
    records = list(zip(data.sizes_range(lo, hi).tolist(), range(lo, hi)))
    secs, out = w.timed(lambda: baselines.published_sample_sort(w.mpi, records), a["repeats"])
    ok = all(out[i] <= out[i + 1] for i in range(len(out) - 1))
    ok = _sorted_across(w, out[0] if out else None, out[-1] if out else None, len(out), ok)
    n_out = w.mpi.allreduce(len(out))
    return {"seconds": secs, "records": total, "sorted": ok and n_out == total}


def sort_floor(a: dict) -> dict:
    """Time one-process ``np.sort`` of all ``total`` packed records."""
    keys = data.packed_keys(0, a["total"], a["total"])
    secs, _ = _best(lambda: baselines.local_sort_floor(keys), a["repeats"])  # np.sort copies: keys stay unsorted
    return {"seconds": secs, "records": a["total"]}


def sort_floor_threads(a: dict) -> dict:
    """Time ``threads`` concurrent ``np.sort`` calls, each on 1/threads of the ``total`` run keys.

    The floor of any ``threads``-way parallel sort of these keys: every thread sorts its
    share in memory, and nothing is merged or moved (np.sort releases the GIL).
    """
    from concurrent.futures import ThreadPoolExecutor

    total, threads = a["total"], a["threads"]
    bounds = [(total * t) // threads for t in range(threads + 1)]
    parts = [data.packed_keys(bounds[t], bounds[t + 1], total) for t in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        secs, _ = _best(lambda: list(pool.map(np.sort, parts)), a["repeats"])
    return {"seconds": secs, "records": total, "threads": threads}


def pack(a: dict) -> dict:
    """Time ``kernels.greedy_pack`` vs the Python oracle and the numpy greedy on sorted sizes."""
    from sortpack import kernels

    sizes = np.sort(data.sizes_range(0, a["n"]))
    budget = a["max_tokens"]
    t_kernel, got = _best(lambda: kernels.greedy_pack(sizes, budget), a["repeats_kernel"])
    # the tokens budget on the same sizes, timed right after the padded one (the same load on both)
    t_tokens, tokens = _best(lambda: kernels.greedy_pack(sizes, budget, "tokens"), a["repeats_kernel"])
    t_numpy, vec = _best(lambda: baselines.greedy_numpy(sizes, budget), a["repeats"])
    check = min(a.get("check_n") or a["n"], a["n"])
    t_oracle, want = _best(lambda: baselines.greedy_oracle(sizes[:check], budget), 1)
    want_tokens = baselines.greedy_tokens_oracle(sizes[:check], budget)
    if check < a["n"]:
        got = kernels.greedy_pack(sizes[:check], budget)
        tokens = kernels.greedy_pack(sizes[:check], budget, "tokens")
        vec = baselines.greedy_numpy(sizes[:check], budget)
    return {"kernel_s": t_kernel, "numpy_s": t_numpy, "oracle_s": t_oracle, "oracle_n": check, "n": a["n"],
            "microbatches": len(want) - 1, "kernel_equal": bool(np.array_equal(got, want)),
            "numpy_equal": bool(np.array_equal(vec, want)), "tokens_s": t_tokens,
            "tokens_equal": bool(np.array_equal(tokens, want_tokens)), "compiled": _compiled()}


def _compiled() -> bool:
    from sortpack import kernels

    backend = getattr(kernels, "backend", None)
    return backend is not None and backend() == "c"


def io_floor(a: dict) -> dict:
    """Time the I/O floor: read the column, write one Arrow IPC file."""
    files = sorted(Path(a["dir"]).glob("*.parquet"))
    out = Path(a["out"])
    secs, rows = _best(lambda: baselines.io_floor(files, a["column"], out), a["repeats"])
    out.unlink(missing_ok=True)
    return {"seconds": secs, "rows": rows}


def _pin_arrow(threads: int) -> None:
    import pyarrow as pa

    if threads:
        pa.set_cpu_count(threads)
        pa.set_io_thread_count(threads)


def analyze(a: dict) -> dict:
    """Time ``sortpack.stages.analyze.analyze`` (barrier to barrier) over this job's ranks."""
    from sortpack.parallel import MPIComm
    from sortpack.stages.analyze import AnalyzeOptions
    from sortpack.stages.analyze import analyze as run

    _pin_arrow(1)  # sortpack's CLI default: --threads 1
    w = _World()
    comm = MPIComm(w.mpi)
    opts = AnalyzeOptions(column=a["column"], size=a["size"], tokenizer=a.get("tokenizer"))
    secs, out = w.timed(lambda: run(comm, [a["path"]], opts), a["repeats"])
    return {"seconds": secs, "samples": out.total, "size_sum": w.mpi.allreduce(int(out.size.sum()))}


def utf8_length(a: dict) -> dict:
    """Time the baseline: read the column, ``pc.utf8_length``, to numpy (one thread)."""
    _pin_arrow(1)
    secs, out = _best(lambda: baselines.utf8_length_baseline(Path(a["path"]), a["column"]), a["repeats"])
    return {"seconds": secs, "samples": len(out), "size_sum": int(out.sum())}


def encode(a: dict) -> dict:
    """Time the baseline ``Tokenizer.encode_batch`` on the texts (read untimed)."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a["tokenizer"])
    texts = pq.read_table(a["path"], columns=[a["column"]]).column(a["column"]).to_pylist()
    base = baselines.encode_batch_fast_baseline if a.get("fast") else baselines.encode_batch_baseline
    secs, out = _best(lambda: base(tok, texts), a["repeats"])
    return {"seconds": secs, "samples": len(out), "size_sum": int(out.sum())}


def reader(a: dict) -> dict:
    """Time opening an index (``PackedIndex``) and walking rank 0's steps (``PackedSampler``)."""
    try:
        from sortpack import reader as rd
    except ImportError as exc:
        return {"skipped": f"sortpack.reader not importable ({exc})"}
    if not hasattr(rd, "PackedIndex"):
        return {"skipped": "sortpack.reader has no PackedIndex"}
    world, accum = a["world_size"], a["grad_accum"]
    opens = []
    for _ in range(a["repeats"]):
        t0 = time.perf_counter()
        index = rd.PackedIndex(a["path"])
        opens.append(time.perf_counter() - t0)
    result = {"open_s": min(opens), "open_first_s": opens[0], "microbatches": index.num_microbatches}
    sampler_cls = getattr(rd, "PackedSampler", None)
    if sampler_cls is None:
        return {**result, "skipped": "sortpack.reader has no PackedSampler"}
    t0 = time.perf_counter()
    sampler = sampler_cls(index, rank=0, world_size=world, grad_accum=accum)
    steps_total = sampler.num_steps
    plan_s = time.perf_counter() - t0
    count, limit = 0, a["max_steps"] * accum
    t0 = time.perf_counter()
    for _mb in sampler:
        count += 1
        if count % accum == 0:
            sampler.lr_scale(1.0)  # a training loop asks each step's LR scale
        if count >= limit:
            break
    walk = time.perf_counter() - t0
    steps = count // accum
    return {**result, "plan_s": plan_s, "steps": steps, "steps_total": steps_total,
            "per_step_s": walk / max(steps, 1),
            "api": f"PackedSampler(index, rank=0, world_size={world}, grad_accum={accum}), iterated, lr_scale per step"}


KINDS = {f.__name__: f for f in (sort_sortpack, sort_stage, sort_published, sort_floor, sort_floor_threads, pack,
                                 io_floor, analyze, utf8_length, encode, reader)}


def main(argv: list[str]) -> int:
    """Run worker ``argv[0]`` with JSON arguments ``argv[1]``; rank 0 prints the result line."""
    kind, args = argv[0], json.loads(argv[1])
    result = KINDS[kind](args)
    from sortpack.launcher import launcher_rank

    if launcher_rank() == 0:
        print(PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
