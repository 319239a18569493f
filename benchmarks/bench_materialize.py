"""Materialize figures: train-time fetch from stored data vs the Parquet source, and the cost of storing.

    python benchmarks/bench_materialize.py --scale small   # 100k and 200k rows (minutes)
    python benchmarks/bench_materialize.py --scale full    # 1M and 5M rows (row groups of 100k)
    python benchmarks/bench_materialize.py --scale full --repeat 3   # medians, for a noisy machine

Prints one table. Fetch: one process iterates micro-batches in ``shuffle`` order through
``SourceDataset`` (items as Python rows), stored (``run --store text``) against the Parquet
source (the same index without stored data), samples/s and the ratio. Materialize: the
``materialize`` stage's wall time (from ``--profile``'s manifest provenance) at P=1 and P=2
against an I/O floor measured in the same run: one process reading the same column with
pyarrow and writing it once as Arrow IPC.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SCALES = {"small": [100_000, 200_000], "full": [1_000_000, 5_000_000]}


def make_data(directory: Path, rows: int, row_group: int, seed: int = 0) -> None:
    """Write ``rows`` text rows (lengths 20..2000 characters) as Parquet files of 10 row groups."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz", dtype=np.uint8)
    pool = alphabet[rng.integers(0, len(alphabet), 4096)].tobytes().decode()
    per_file = row_group * 10
    for k, start in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - start)
        lengths = rng.integers(20, 2000, n)
        offs = rng.integers(0, 4096 - 2000, n)
        texts = [pool[o:o + m] for o, m in zip(offs.tolist(), lengths.tolist())]
        pq.write_table(pa.table({"text": texts, "id": np.arange(start, start + n)}),
                       directory / f"part-{k:04d}.parquet", row_group_size=row_group)


def sortpack(args: list, ranks: int = 1) -> None:
    """Run the sortpack CLI (under mpiexec with ``ranks`` > 1)."""
    cmd = [sys.executable, "-m", "sortpack", *map(str, args)]
    if ranks > 1:
        cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks), *cmd]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)


def fetch_rate(plan: Path, max_seconds: float, stored: bool) -> float:
    """Return samples/s of one process fetching micro-batches in shuffle order through SourceDataset."""
    from sortpack.reader import PackedIndex
    from sortpack.torch import PackedBatchSampler, SourceDataset

    index = PackedIndex(plan)
    ds = SourceDataset(plan, stored=stored)
    n, t0 = 0, time.perf_counter()
    for mb in PackedBatchSampler(index, rank=0, world_size=1, order="shuffle", seed=1):
        n += len(ds.__getitems__(mb))
        if time.perf_counter() - t0 > max_seconds:
            break
    return n / (time.perf_counter() - t0)


def io_floor(data: Path, out: Path) -> float:
    """Return seconds to read the text column with pyarrow and write it once as Arrow IPC."""
    t0 = time.perf_counter()
    with pa.OSFile(str(out), "wb") as sink:
        writer = None
        for f in sorted(data.glob("*.parquet")):
            table = pq.read_table(f, columns=["text"])
            if writer is None:
                writer = pa.ipc.new_file(sink, table.schema)
            writer.write_table(table)
        writer.close()
    return time.perf_counter() - t0


def materialize_seconds(plan: Path) -> float:
    """Return the materialize stage's wall time recorded in a plan's provenance."""
    prof = json.loads((plan / "manifest.json").read_text())["provenance"]["profile"]
    return float(prof["materialize"]["wall_s"])


def main() -> None:
    """Measure and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--workdir", default=None, help="Where to write data (default: a temporary directory).")
    ap.add_argument("--fetch-seconds", type=float, default=10.0, help="Time spent per fetch measurement.")
    ap.add_argument("--repeat", type=int, default=1,
                    help="Runs of each materialize and floor measurement; the table gives medians.")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-materialize-"))
    row_group = 100_000 if args.scale == "full" else 10_000
    lines = [f"{'rows':>9} {'measure':<34} {'value':>12} {'baseline':>12} {'ratio':>7}"]
    for rows in SCALES[args.scale]:
        data = work / f"data-{rows}"
        if not data.exists():
            make_data(data, rows, row_group)
        common = [data, "--column", "text", "--max-tokens", "65536", "--quiet", "--overwrite", "--profile"]
        plans, seconds, floors = {}, {1: [], 2: []}, []
        for _ in range(max(1, args.repeat)):  # interleaved, so a slow spell of the machine hits all three
            floors.append(io_floor(data, work / "floor.arrow"))
            for ranks in (1, 2):
                plans[ranks] = work / f"plan-{rows}-p{ranks}"
                sortpack(["run", *common, "-o", plans[ranks], "--store", "text"], ranks)
                seconds[ranks].append(materialize_seconds(plans[ranks]))
        floor = float(np.median(floors))
        stored = fetch_rate(plans[1], args.fetch_seconds, stored=True)
        source = fetch_rate(plans[1], args.fetch_seconds, stored=False)
        lines.append(f"{rows:>9} {'fetch samples/s stored vs parquet':<34} {stored:>12.0f} {source:>12.0f} "
                     f"{stored / source:>7.1f}")
        for ranks in (1, 2):
            sec = float(np.median(seconds[ranks]))
            lines.append(f"{rows:>9} {f'materialize s P={ranks} vs I/O floor':<34} {sec:>12.2f} {floor:>12.2f} "
                         f"{sec / floor:>7.2f}")
    print("\n".join(lines))
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
