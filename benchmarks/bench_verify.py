"""What the read-side checks cost (docs/guarantees.md): reader levels, a stage's verification, input digests.

    PYTHONPATH=$PWD python -m benchmarks.bench_verify [--samples 2000000] [--rows 10000000] [--repeat 5]

Writes its inputs under ``benchmarks/_work/verify`` (reused when present) and prints medians
of ``--repeat`` interleaved runs:

- ``PackedIndex(path, verify=LEVEL)``, alone and with every sample id read once
  (``all_sample_ids()``: every shard mapped, as in an epoch), for an index of ``--samples``
  samples, at "structure", "index" and "full";
- a ``sort`` of a metrics directory of ``--rows`` rows (in process, one rank): the read
  stage with the shard hashes (``shards.check_shards``) and the hashes alone;
- the sha256 of a JSONL file against ``pyarrow.json.read_json`` of it (analyze's parse).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

WORK = Path(__file__).resolve().parent / "_work" / "verify"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _inputs(samples: int, rows: int) -> tuple[Path, Path, Path]:
    from sortpack.parallel import SerialComm
    from sortpack.pipeline.dataset import JobInfo, JobOutput, run_all, run_analyze
    from sortpack.stages.analyze import AnalyzeOptions
    from sortpack.stages.pack import PackOptions
    from sortpack.stages.plan_options import PlanOptions
    from sortpack.stages.sort import SortOptions

    WORK.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    index = WORK / f"index-{samples}"
    if not (index / "manifest.json").exists():
        src = WORK / f"sizes-{samples}.parquet"
        sizes = np.clip(np.ceil(rng.lognormal(np.log(300), 1.0, samples)), 1, 4096).astype(np.int64)
        pq.write_table(pa.table({"n": sizes}), src, row_group_size=1 << 18)
        run_all(SerialComm(), [str(src)], PlanOptions(AnalyzeOptions(size="column:n"), SortOptions(),
                                                      PackOptions(max_tokens=16384)),
                JobOutput(str(index), JobInfo(argv=["bench"]), overwrite=True))
    metrics = WORK / f"metrics-{rows}"
    if not (metrics / "manifest.json").exists():
        src = WORK / f"sizes-{rows}.parquet"
        pq.write_table(pa.table({"n": rng.integers(1, 4096, rows)}), src, row_group_size=1 << 20)
        run_analyze(SerialComm(), [str(src)], AnalyzeOptions(size="column:n"),
                    JobOutput(str(metrics), JobInfo(argv=["bench"]), overwrite=True))
    text = WORK / "text.jsonl"
    if not text.exists():
        with open(text, "w") as fh:
            for i in range(300_000):
                fh.write(json.dumps({"text": "lorem ipsum dolor " * int(rng.integers(1, 60)), "id": i}) + "\n")
    return index, metrics, text


def main(argv=None) -> None:
    """Print the medians of the read-side checks' costs."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=2_000_000)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    index, metrics, text = _inputs(args.samples, args.rows)

    from sortpack.format.manifest import read_manifest
    from sortpack.format.shards import check_shards, read_rows
    from sortpack.reader import PackedIndex

    def open_and_read(level):
        return lambda: PackedIndex(index, verify=level).all_sample_ids()

    def open_only(level):
        return lambda: PackedIndex(index, verify=level)

    from sortpack.parallel import SerialComm
    from sortpack.pipeline.dataset import JobInfo, JobOutput, run_sort
    from sortpack.stages.sort import SortOptions
    from sortpack.write import sample_dirs

    def sort(verify: bool):
        def run():
            saved = sample_dirs.check_shards
            if not verify:
                sample_dirs.check_shards = lambda *a, **k: None
            try:
                run_sort(SerialComm(), str(metrics), SortOptions(),
                         JobOutput(str(WORK / "sorted"), JobInfo(argv=["b"]), overwrite=True))
            finally:
                sample_dirs.check_shards = saved
        return run

    m = read_manifest(metrics)
    timings: dict[str, list[float]] = {}
    cases = {
        **{f"PackedIndex open, {lvl}": open_only(lvl) for lvl in ("structure", "index", "full")},
        **{f"PackedIndex open + all_sample_ids(), {lvl}": open_and_read(lvl)
           for lvl in ("structure", "index", "full")},
        f"sort of {args.rows} rows, verified": sort(True),
        f"sort of {args.rows} rows, not verified": sort(False),
        f"read {args.rows} metrics rows": lambda: read_rows(metrics, m, 0, m["num_rows"]),
        f"check_shards of {args.rows} metrics rows": lambda: check_shards(metrics, m, 0, m["num_rows"]),
        "sha256 of text.jsonl": lambda: hashlib.sha256(text.read_bytes()).hexdigest(),
        "pyarrow.json.read_json of text.jsonl": lambda: __import__("pyarrow.json").json.read_json(text),
    }
    for _ in range(args.repeat):
        for name, fn in cases.items():
            timings.setdefault(name, []).append(_timed(fn))
    ix = PackedIndex(index)
    print(f"index: {ix.num_samples} samples, {len(ix)} micro-batches, "
          f"{sum(int(e['bytes']) for e in ix.manifest['shards']) / 1e6:.1f} MB in {len(ix.manifest['shards'])} shards")
    print(f"metrics: {m['num_rows']} rows, {sum(int(e['bytes']) for e in m['shards']) / 1e6:.1f} MB; "
          f"text.jsonl {text.stat().st_size / 1e6:.1f} MB")
    for name, ts in timings.items():
        print(f"{name:<50} median {1e3 * statistics.median(ts):9.1f} ms  (of {len(ts)})")


if __name__ == "__main__":
    main()
