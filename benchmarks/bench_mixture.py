"""Mixture planning vs planning the union of its inputs as one dataset (goal: at most 1.3x).

Three sources of ``--size column:n`` sizes (web 60%, code 25%, books 15% of the samples, each
its own size range), 20M samples at ``--scale full``. Per rank count, ``sortpack run --mixture``
(weights 0.25/0.3/0.45, then 0.1/0.3/0.6 for the last fifth; ``total_tokens`` the union's tokens:
books repeat 1.3 times, web is a subset) and ``sortpack run`` of the same inputs alternate over rounds; the fastest of
each is kept and their ratio reported, measured in the same run. Registered in ``suite.py``
as ``mixture``: ``python -m benchmarks --only mixture [--scale small|full]``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from . import data
from .report import Row, secs

MAX_TOKENS = 65536  # a language model's budget: tens of samples per micro-batch
SHARES = (("web", 0.60, 128, 2048), ("code", 0.25, 256, 4096), ("books", 0.15, 1024, 8192))
TARGET = 1.3


def _sources(n: int) -> tuple[Path, dict]:
    """Return (directory with web/, code/, books/ Parquet of an int32 ``n`` column, token totals)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = data.WORK / f"mixture-{n}"
    done = root / "_done.json"
    if done.is_file():
        return root, json.loads(done.read_text())
    totals = {}
    first = 0
    for k, (name, share, lo, hi) in enumerate(SHARES):
        rows = int(n * share)
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        sizes = lo + data.sizes_range(first, first + rows, data.SEED + k) % (hi - lo + 1)
        first += rows
        for i, part in enumerate(np.array_split(sizes, 2)):
            pq.write_table(pa.table({"n": pa.array(part.astype(np.int32))}), d / f"part-{i}.parquet",
                           row_group_size=1 << 18)
        totals[name] = int(sizes.sum())
    done.write_text(json.dumps(totals))
    return root, totals


def bench(ctx) -> list[Row]:
    """Return the rows: mixture vs union wall time per rank count, and the plan's figures."""
    from .runner import sortpack_cli

    n = 20_000_000 if ctx.scale_name == "full" else 300_000
    ctx.log(f"generating {n / 1e6:g}M sizes in three sources")
    root, totals = _sources(n)
    held = sum(totals.values())
    spec = {"sources": [{"name": name, "inputs": [str(root / name)], "weight": w}
                        for name, w in (("web", 0.25), ("code", 0.3), ("books", 0.45))],
            "total_tokens": held,
            "schedule": [{"until": 0.8}, {"until": 1.0, "weights": {"web": 0.1, "books": 0.6}}]}
    mix = root / "mix.json"
    mix.write_text(json.dumps(spec))
    out = data.work_dir("mixture-out")
    common = ["--size", "column:n", "--max-tokens", str(MAX_TOKENS), "--overwrite", "--quiet"]
    best: dict = {}
    for r in range(ctx.scale.rounds):
        for p in ctx.ranks:
            ctx.log(f"round {r + 1}/{ctx.scale.rounds}, P={p}: union run, then mixture run")
            union = sortpack_cli(["run", *(str(root / s[0]) for s in SHARES), "-o", str(out / f"union-{p}"),
                                  *common], ctx.scale.timeout, p)
            mixed = sortpack_cli(["run", "--mixture", str(mix), "-o", str(out / f"mix-{p}"), *common],
                                 ctx.scale.timeout, p)
            prev = best.get(p, (float("inf"), float("inf")))
            best[p] = (min(prev[0], union), min(prev[1], mixed))
    rows, hashes = [], {}
    for p in ctx.ranks:
        union, mixed = best[p]
        man = json.loads((out / f"mix-{p}" / "manifest.json").read_text())
        hashes[p] = man["content_hash"]
        mixture = man["mixture"]
        blend = man["provenance"]["profile"].get("blend", {}).get("wall_s", 0.0)
        ratio = mixed / union
        rows.append(Row("mixture", f"run --mixture, 3 sources, {n / 1e6:g}M samples, vs run of their union", p,
                        secs(mixed), f"union: {secs(union)}", f"{ratio:.2f}× union", f"≤ {TARGET}×",
                        ratio <= TARGET,
                        f"blend stage {secs(blend)}; {man['num_microbatches']} micro-batches; max deviation "
                        f"{mixture['max_deviation_tokens'] / mixture['bound_tokens']:.2f} of the largest micro-batch; "
                        f"books {mixture['sources'][2]['passes']:.2f} passes"))
        ctx.time_at("mixture: run --mixture", p, mixed)
    if len(hashes) > 1:
        same = len(set(hashes.values())) == 1
        ctx.notes.append(f"`run --mixture` content_hash {'identical' if same else 'DIFFERS'} across P = "
                         f"{', '.join(map(str, hashes))} (determinism check).")
    shutil.rmtree(out, ignore_errors=True)
    return rows
