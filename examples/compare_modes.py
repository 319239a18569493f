"""Pack one dataset in every packing mode and tabulate what `sortpack inspect` reports.

    python examples/compare_modes.py example/ --column text --max-tokens 16384
    python examples/compare_modes.py --lognormal 1000000 --max-tokens 65536
    python examples/compare_modes.py --lognormal 10000 --modes padded,rows

With --lognormal N it first writes N token counts drawn log-normal (median 300, clipped
to 8192) and measures `--size column:ntokens`. Prints padding, fill, distinct shapes, step
imbalance (world size 8) and truncated samples per mode (every mode runs with `--oversize
truncate`), with ratios against the default padded budget. Works in a temporary directory
that it removes.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def modes(max_tokens: int) -> list[tuple[str, list[str]]]:
    """Return (name, extra options) of each packing mode compared."""
    q = max(1, max_tokens // 16)
    row = max(1, max_tokens // 2)  # two rows per micro-batch: the same tokens per micro-batch
    return [
        ("padded (default)", []),
        ("tokens", ["--budget", "tokens"]),
        (f"quadratic Q={q}", ["--budget", "quadratic", "--quadratic-scale", str(q)]),
        ("pad-to-multiple 64", ["--pad-to-multiple", "64"]),
        ("shapes pow2", ["--shapes", ",".join(str(2 ** k) for k in range(6, 17))]),
        ("same-shape G=4", ["--group-size", "4", "--same-shape"]),
        (f"rows {row} x2", ["--rows", str(row), "--rows-per-microbatch", "2"]),
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="*")
    parser.add_argument("--column", default=None)
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--lognormal", type=int, default=0, help="generate N log-normal token counts")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--modes", default="",
                        help="comma-separated name prefixes of the modes to run (default: all)")
    return parser


def compare(args, work: Path) -> list[tuple[str, dict]]:
    """Return (mode name, inspect report) of every mode, run in ``work``."""
    size = ["--column", args.column] if args.column else []
    inputs = args.inputs
    if args.lognormal:
        rng = np.random.default_rng(0)
        n = np.clip(np.ceil(rng.lognormal(np.log(300), 1.0, args.lognormal)), 1, 8192).astype(np.int64)
        pq.write_table(pa.table({"ntokens": n}), work / "lognormal.parquet", row_group_size=1 << 18)
        inputs, size = [str(work / "lognormal.parquet")], ["--size", "column:ntokens"]
    rows = []
    wanted = [w.strip() for w in args.modes.split(",") if w.strip()]
    for name, extra in modes(args.max_tokens):
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        out = work / f"plan-{len(rows)}"
        budget = [] if "--rows" in extra else ["--max-tokens", str(args.max_tokens)]
        cmd = [sys.executable, "-m", "sortpack", "run", *inputs, "-o", str(out), *size, *budget,
               "--oversize", "truncate", "--quiet", *extra]
        subprocess.run(cmd, check=True, timeout=600)
        report = json.loads(subprocess.run(
            [sys.executable, "-m", "sortpack", "inspect", str(out), "--world-size", str(args.world_size), "--json"],
            check=True, capture_output=True, text=True, timeout=600).stdout)
        rows.append((name, report))
    return rows


def main() -> None:
    args = _parser().parse_args()
    with tempfile.TemporaryDirectory(prefix="sortpack-modes-") as work:
        rows = compare(args, Path(work))
    base = rows[0][1]
    print(f"{'mode':<20} {'micro-batches':>13} {'padding':>8} {'fill':>8} {'shapes':>7} "
          f"{'imbalance':>9} {'truncated':>9} {'padded tokens vs default':>25}")
    for name, r in rows:
        print(f"{name:<20} {r['num_microbatches']:>13} {100 * r['padding_ratio']:>7.2f}% {100 * r['fill']:>7.2f}% "
              f"{r['distinct_shapes']:>7} {r.get('step_imbalance', 1.0):>9.3f} {r['truncated']:>9} "
              f"{r['padded_tokens'] / base['padded_tokens']:>24.3f}x")


if __name__ == "__main__":
    main()
