"""One node's ranks: weak scaling from 1 rank to every core, and the whole-node run of N per rank.

    PYTHONPATH=$PWD python -m benchmarks.bench_node --scale full            # 62.5M samples per rank
    PYTHONPATH=$PWD python -m benchmarks.bench_node --scale small --ranks 1,2

``sortpack run DIR --size column:ntokens --profile`` at P = 1, 2, 4, ... up to the machine's cores
(``--ranks`` to choose), each P on P files of N rows (N = 62.5M at full scale: 16 ranks on a
16-core node are then 1B samples, the share of "1B in 6 s on 16 ranks" one rank must hold). The
files are written once, in parallel, each the same as every other P's first files, so P=16's
input holds P=8's. Rounds alternate the P values and keep each P's fastest. The table gives, per
P: the whole command, each stage (max over ranks), start-up, peak memory per rank, CPU per rank
and the weak-scaling ratio (wall at P over wall at 1); ``content_hash`` is printed so runs at the
same P can be compared across checkouts. Every figure carries the 1-minute load average.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from . import data
from .report import Row, Section, print_script_results, secs
from .runner import BenchError, launch

N_PER_RANK = {"small": 1_000_000, "full": 62_500_000}
ROUNDS = {"small": 1, "full": 2}
MAX_TOKENS = 500_000
TIMEOUT = 900
WEAK_TARGET, WHOLE_SECONDS = 1.25, 7.0


def _write_part(args: tuple[Path, int, int]) -> Path:
    """Write one part file of rows [a, b) and return its path."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path, a, b = args
    if not path.is_file():
        tmp = path.with_suffix(".tmp")
        table = pa.table({"ntokens": pa.array(data.sizes_range(a, b).astype(np.int32))})
        pq.write_table(table, tmp, row_group_size=1 << 18)
        tmp.rename(path)
    return path


def inputs(n: int, ranks: list[int]) -> dict[int, Path]:
    """Return, per P, a directory of links to the first P part files (each ``n`` rows), written once in parallel."""
    parts_dir = data.work_dir(f"node-parts-{n}")
    most = max(ranks)
    jobs = [(parts_dir / f"part-{i:03d}.parquet", i * n, (i + 1) * n) for i in range(most)]
    with ProcessPoolExecutor(max_workers=min(most, os.cpu_count() or 1)) as pool:
        parts = list(pool.map(_write_part, jobs))
    dirs = {}
    for p in ranks:
        d = data.work_dir(f"node-input-{n}-P{p}")
        for part in parts[:p]:
            link = d / part.name
            if not link.exists():
                link.symlink_to(part)
        dirs[p] = d
    return dirs


def _run(inputs_dir: Path, out: Path, p: int) -> dict:
    """Return one ``sortpack run --profile`` at P ranks: wall, profile, hash and the load at start."""
    load = os.getloadavg()[0]
    wall, _ = launch([sys.executable, "-m", "sortpack", "run", str(inputs_dir), "-o", str(out), "--size",
                      "column:ntokens", "--max-tokens", str(MAX_TOKENS), "--profile", "--overwrite", "--quiet"],
                     TIMEOUT, p, pin_rayon=False)
    man = json.loads((out / "manifest.json").read_text())
    made_by = len(man["provenance"]["profile"].get("cpu_s_per_rank", []))
    if made_by != p:
        # mpiexec of one MPI and mpi4py of another start P singletons, each planning every file
        raise BenchError(f"{p} ranks asked, the plan was made by {made_by}: mpiexec and mpi4py come from "
                         "different MPI libraries (MPI4PY_LIBMPI)")
    return {"wall": wall, "profile": man["provenance"]["profile"], "hash": man["content_hash"], "load": load,
            "samples": man["num_samples"]}


def measure(scale: str, ranks: list[int], log) -> tuple[list[Section], list[Row]]:
    """Alternate the P values for the scale's rounds; return the table and the goal rows."""
    n = N_PER_RANK[scale]
    dirs = inputs(n, ranks)
    out = data.work_dir("node-out")
    best: dict[int, dict] = {}
    for r in range(ROUNDS[scale]):
        for p in ranks:
            res = _run(dirs[p], out / f"P{p}", p)
            log(f"round {r + 1}, P={p} on {p * n / 1e6:g}M: {res['wall']:.2f} s (load {res['load']:.1f})")
            if p not in best or res["wall"] < best[p]["wall"]:
                best[p] = res
            shutil.rmtree(out / f"P{p}", ignore_errors=True)
    return _tables(n, ranks, best)


def _tables(n: int, ranks: list[int], best: dict[int, dict]) -> tuple[list[Section], list[Row]]:
    sec = Section(f"weak scaling on one node, {n / 1e6:g}M samples per rank, --size column:ntokens "
                  f"(fastest of the rounds; stages max over ranks)", ["part"] + [f"P={p}" for p in ranks])
    stages = [k for k, v in best[ranks[0]]["profile"].items() if isinstance(v, dict)]

    def row(name: str, values: list[str]) -> None:
        sec.rows.append([name] + values)

    row("samples", [f"{best[p]['samples'] / 1e6:g}M" for p in ranks])
    row("whole command", [secs(best[p]["wall"]) for p in ranks])
    row("wall / wall at P=1", [f"{best[p]['wall'] / best[ranks[0]]['wall']:.2f}" for p in ranks])
    for name in stages:
        row(name, [secs(best[p]["profile"].get(name, {}).get("wall_s", 0.0)) for p in ranks])
    row("start-up (max over ranks)", [secs(best[p]["profile"].get("startup_s", 0.0)) for p in ranks])
    row("between stages", [secs(best[p]["profile"].get("outside_stages_s", 0.0)) for p in ranks])
    row("CPU per rank (max)", [secs(max(best[p]["profile"].get("cpu_s_per_rank", [0.0]))) for p in ranks])
    row("peak memory per rank (max)", [f"{best[p]['profile'].get('peak_rss_bytes_max', 0) / 2**30:.2f} GiB"
                                       for p in ranks])
    row("load at start", [f"{best[p]['load']:.1f}" for p in ranks])
    row("content_hash", [best[p]["hash"][:12] for p in ranks])
    one, most = best[ranks[0]], best[ranks[-1]]
    ratio = most["wall"] / one["wall"]
    rows = [Row("node", f"weak scaling: P={ranks[-1]} on {ranks[-1] * n / 1e6:g}M / P={ranks[0]} on "
                f"{ranks[0] * n / 1e6:g}M", ranks[-1], secs(most["wall"]), f"P={ranks[0]}: {secs(one['wall'])}",
                f"{ratio:.2f}×", f"≤ {WEAK_TARGET}×", ratio <= WEAK_TARGET, f"load {most['load']:.1f}"),
            Row("node", f"whole run, {most['samples'] / 1e6:g}M samples at P={ranks[-1]}", ranks[-1],
                secs(most["wall"]), "", "", f"≤ {WHOLE_SECONDS:g} s" if n == N_PER_RANK["full"] else "",
                most["wall"] <= WHOLE_SECONDS if n == N_PER_RANK["full"] else None, f"load {most['load']:.1f}")]
    return [sec], rows


def _default_ranks() -> list[int]:
    cores = os.cpu_count() or 1
    ranks = [1]
    while ranks[-1] * 2 <= cores:
        ranks.append(ranks[-1] * 2)
    return ranks


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_node", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(N_PER_RANK), default="small")
    ap.add_argument("--ranks", help="comma-separated rank counts (default: 1, 2, 4, ... up to the cores)")
    args = ap.parse_args(argv)
    ranks = sorted({int(x) for x in args.ranks.split(",")}) if args.ranks else _default_ranks()
    print(f"bench_node, scale {args.scale}, ranks {ranks}, load average "
          f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} cores", flush=True)

    def log(msg: str) -> None:
        print(f"  .. {msg}", flush=True)

    sections, rows = measure(args.scale, ranks, log)
    print_script_results(sections, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
