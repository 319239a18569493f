"""Compute balance of a step across ranks: sortpack's rows, --balance compute, multipack, Karmarkar-Karp.

Chat-like lengths (log-normal, median 600, sigma 1.2, clipped to 16..32768; 1M samples at
``--scale full``, 20k small), rows of 32768 tokens, one row per micro-batch, A = 1. A sample of
s tokens costs ``C*s + s^2`` (C = 6144, ``d_model`` 1024); each rank's cost in a step is the sum
over its micro-batches, dealt rank-interleaved as the reader deals them. Per W (8 and 64):
``p99`` of the steps' max/mean over ranks and ``weighted`` (sum of step maxima / sum of step means).

- sortpack default: ``sortpack run --rows 32768``;
- sortpack ``--balance compute``;
- multipack-style rows (``baselines.multipack_rows``: random order, each step the longest run
  of samples that first-fit-decreasing packs into W rows, one row to each rank);
- Karmarkar-Karp per global batch (``baselines.karmarkar_karp``, as verl and slime balance): the
  samples in random order, cut into global batches of W rows' worth of tokens, each partitioned
  into W parts of balanced cost (each rank then trains its part).

Registered in ``suite.py`` as ``balance``: ``python -m benchmarks --only balance [--scale small|full]``.

``bench_targets`` (registered as ``balance_targets``) measures ``--balance targets`` on generated
chats: the loss targets each rank of a step trains, default rows against rows composed by
their targets, and the best any order of those rows could do.
"""
from __future__ import annotations

import json
import shutil

import numpy as np

from . import baselines, data
from .report import Row, Section, secs

ROW = 32768
C = 6144.0
WORLDS = (8, 64)


def chat_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Return n chat-like lengths: log-normal, median 600, sigma 1.2, clipped to 16..32768."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(600), 1.2, n)), 16, ROW).astype(np.int64)


def imbalance(costs: np.ndarray) -> tuple[float, float]:
    """Return (p99 of max/mean over ranks per step, sum of step maxima / sum of step means) of (steps, W)."""
    mean, top = costs.mean(axis=1), costs.max(axis=1)
    return float(np.quantile(top / mean, 0.99)), float(top.sum() / mean.sum())


def dealt(cost: np.ndarray, world: int) -> np.ndarray:
    """Return the (steps, W) costs of micro-batches dealt rank-interleaved (a short tail repeats the start)."""
    steps = -(-len(cost) // world)
    return cost[np.arange(steps * world) % len(cost)].reshape(steps, world)


def _plan_costs(directory, weight: np.ndarray) -> tuple[np.ndarray, float]:
    """Return (each micro-batch's cost, the row fill) of a sortpack index."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    man = json.loads((directory / "manifest.json").read_text())
    t = pa.concat_tables([ipc.open_file(str(directory / s["file"])).read_all() for s in man["shards"]])
    ids = t.column("sample_ids").combine_chunks()
    flat = ids.flatten().to_numpy().astype(np.int64)
    offsets = ids.offsets.to_numpy().astype(np.int64)
    cost = np.add.reduceat(weight[flat], offsets[:-1])
    fill = t.column("tokens").to_numpy().sum() / (t.column("batch_size").to_numpy().sum() * ROW)
    return cost, float(fill)


def _kk_costs(sizes: np.ndarray, weight: np.ndarray, world: int, seed: int = 0) -> np.ndarray:
    """Return the (steps, W) costs of Karmarkar-Karp partitions of random-order global batches of W rows' tokens."""
    order = np.random.default_rng(seed).permutation(len(sizes))
    cum = np.cumsum(sizes[order])
    cuts = np.searchsorted(cum, np.arange(world * ROW, int(cum[-1]) + world * ROW, world * ROW), side="right")
    out, a = [], 0
    for b in np.unique(cuts):
        if b <= a:
            continue
        batch = order[a:b]
        parts = baselines.karmarkar_karp(weight[batch].tolist(), world)
        out.append([float(weight[batch[p]].sum()) if p else 0.0 for p in parts])
        a = int(b)
    return np.asarray(out)


def bench(ctx) -> list[Row]:
    """Return the rows: p99 and weighted compute imbalance of each method at W = 8 and 64."""
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    from .runner import sortpack_cli

    n = 1_000_000 if ctx.scale_name == "full" else 20_000
    ctx.log(f"generating {n / 1e6:g}M chat-like lengths")
    sizes = chat_lengths(n)
    work = data.work_dir("balance")
    pq.write_table(pa.table({"n": sizes}), work / "chat.parquet", row_group_size=1 << 18)
    s = sizes.astype(np.float64)
    weight = C * s + s * s
    results: dict[str, dict] = {}
    for name, extra in (("sortpack --rows (default)", []), ("sortpack --rows --balance compute",
                                                             ["--balance", "compute", "--cost-coeff", str(C)])):
        ctx.log(f"{name}, P=1")
        out = work / name.split()[-1].strip("()")
        wall = sortpack_cli(["run", str(work / "chat.parquet"), "-o", str(out), "--size", "column:n", "--rows",
                             str(ROW), "--overwrite", "--quiet", *extra], ctx.scale.timeout, 1)
        cost, fill = _plan_costs(out, weight)
        results[name] = {"wall": wall, "fill": fill, **{w: imbalance(dealt(cost, w)) for w in WORLDS}}
    ctx.log("multipack-style rows (random order, first-fit-decreasing into W rows a step, round robin)")
    t0 = time.perf_counter()
    mp: dict = {"fill": None}
    for w in WORLDS:
        steps = baselines.multipack_rows(sizes, ROW, w)
        mp[w] = imbalance(np.array([[weight[r].sum() for r in step] for step in steps]))
        mp["fill"] = min(mp["fill"] or 1.0, float(sizes.sum() / (len(steps) * w * ROW)))
    results["multipack-style rows"] = {**mp, "wall": time.perf_counter() - t0}
    ctx.log("Karmarkar-Karp per global batch")
    t0 = time.perf_counter()
    results["Karmarkar-Karp per global batch"] = {"wall": time.perf_counter() - t0, "fill": None,
                                                  **{w: imbalance(_kk_costs(sizes, weight, w)) for w in WORLDS}}
    results["Karmarkar-Karp per global batch"]["wall"] = time.perf_counter() - t0
    section = Section(f"compute balance, {n / 1e6:g}M chat-like lengths, rows of {ROW}, cost C*s + s^2 (C = "
                      f"{C:g}), A = 1", ["method", "fill", *(f"W={w} p99 / weighted" for w in WORLDS), "time"])
    rows = []
    for name, r in results.items():
        section.rows.append([name, "" if r["fill"] is None else f"{100 * r['fill']:.3f}%",
                             *(f"{r[w][0]:.3f} / {r[w][1]:.4f}" for w in WORLDS), secs(r["wall"])])
    bal, base = results["sortpack --rows --balance compute"], results["sortpack --rows (default)"]
    # the target is stated on 1M samples: a small run's cost distribution is too sparse to judge it
    target = "≤ 1.01" if ctx.scale_name == "full" else ""
    for w in WORLDS:
        rows.append(Row("balance", f"--rows {ROW} --balance compute, W={w}: weighted compute imbalance", 1,
                        f"{bal[w][1]:.4f}", f"default rows: {base[w][1]:.4f}", "",
                        target if w == 64 else "", bal[w][1] <= 1.01 if w == 64 and target else None,
                        f"p99 {bal[w][0]:.3f} (default {base[w][0]:.3f}); fill {100 * bal['fill']:.3f}%"))
    ctx.sections.append(section)
    shutil.rmtree(work, ignore_errors=True)
    return rows


def _targets_report(directory) -> dict:
    """Return the targets imbalance at W = 8 and 64 and the row fill of a chat plan (``sortpack inspect``)."""
    from sortpack.reader import PackedIndex
    from sortpack.report.inspect import inspect_directory

    out: dict = {w: inspect_directory(str(directory), world_size=w)["targets_imbalance"] for w in WORLDS}
    report = inspect_directory(str(directory))
    out["fill"] = report["fill"]
    out["padding"] = report["padding_ratio"]
    out["bound"] = {w: order_bound(PackedIndex(directory)["targets"], w) for w in WORLDS}
    return out


def order_bound(targets: np.ndarray, world: int) -> tuple[float, float]:
    """Return (max, p99) of the steps' max/mean that no order of these micro-batches can beat (A = 1).

    The step that holds the micro-batch of most targets has a mean of at most that of the W
    highest, so its max/mean is at least their ratio; with every other step perfect (1.0), p99
    (numpy's linear quantile over the steps) is what that one step contributes.
    """
    t = np.sort(np.asarray(targets, dtype=np.float64))
    top = float(t[-1] / t[-world:].mean())
    steps = -(-len(t) // world)
    at = 0.99 * (steps - 1)
    return top, 1.0 + max(0.0, at - (steps - 2)) * (top - 1.0)


def bench_targets(ctx) -> list[Row]:
    """Return the rows: the targets imbalance of a chat plan at W = 8 and 64, default rows vs ``--balance targets``.

    Generated chats (``bench_sft.make_chats``: turns of log-normal word counts, prompts and answers
    independent; 100k at ``--scale full`` in rows of 4096, 20k at small in rows of 1024) are
    measured and sorted once (``run --keep-intermediate``); the sorted directory is packed with
    each ``--balance``, and ``sortpack inspect --world-size W`` gives the steps' max/mean targets
    over ranks (A = 1, the short tail repeating the start as the reader deals it).
    """
    from .runner import missing_modules, sortpack_cli
    from .sft_data import make_chats, make_tokenizer

    missing = missing_modules("tokenizers", "jinja2")
    if missing:
        return [Row("balance_targets", "targets balance", 1, "skipped", note=f"needs {', '.join(missing)}")]
    full = ctx.scale_name == "full"
    n, row = (100_000, 4096) if full else (20_000, 1024)
    work = data.work_dir("balance_targets")
    tok, config = make_tokenizer(work / "tokenizer")
    ctx.log(f"generating {n} chats")
    chats = make_chats(work / f"chats-{n}", n, seed=1, files=4 if full else 2)
    ctx.log("measuring and sorting them once (run --keep-intermediate)")
    sortpack_cli(["run", *map(str, chats), "-o", str(work / "first"), "--chat-template", str(config), "--tokenizer",
                  str(tok), "--rows", str(row), "--oversize", "skip", "--keep-intermediate", "--overwrite", "--quiet"],
                 ctx.scale.timeout, 1)
    results = {}
    for balance in ("none", "targets"):
        ctx.log(f"pack --rows {row} --balance {balance}, P=1")
        out = work / balance
        wall = sortpack_cli(["pack", str(work / "first.sorted"), "-o", str(out), "--rows", str(row), "--oversize",
                             "skip", "--balance", balance, "--overwrite", "--quiet"], ctx.scale.timeout, 1)
        results[balance] = {"wall": wall, **_targets_report(out)}
    section = Section(f"targets balance, {n // 1000}k generated chats, rows of {row}, A = 1",
                      ["--balance", "fill", "padding", *(f"W={w} p50 / p99 / max / weighted" for w in WORLDS),
                       "pack time"])
    for name, r in results.items():
        section.rows.append([name, f"{100 * r['fill']:.3f}%", f"{r['padding']:.4f}",
                             *(f"{r[w]['p50']:.3f} / {r[w]['p99']:.3f} / {r[w]['max']:.3f} / {r[w]['weighted']:.4f}"
                               for w in WORLDS), secs(r["wall"])])
    bound = results["targets"]["bound"]
    section.rows.append(["(any order of the targets rows: at best)", "", "",
                         *(f"- / {bound[w][1]:.3f} / {bound[w][0]:.3f} / -" for w in WORLDS), ""])
    ctx.sections.append(section)
    bal, base = results["targets"], results["none"]
    rows = [Row("balance_targets", f"--rows {row} --balance targets, W=64: p99 targets imbalance", 1,
                f"{bal[64]['p99']:.3f}", f"default rows: {base[64]['p99']:.3f}", "", "≤ 1.10",
                bal[64]["p99"] <= 1.10, f"weighted {bal[64]['weighted']:.4f} (default {base[64]['weighted']:.4f}); "
                f"fill {100 * bal['fill']:.3f}% (default {100 * base['fill']:.3f}%); no order of these rows "
                f"does better than p99 {bound[64][1]:.3f}, max {bound[64][0]:.3f}"),
            Row("balance_targets", f"--rows {row} --balance targets, W=8: p99 targets imbalance", 1,
                f"{bal[8]['p99']:.3f}", f"default rows: {base[8]['p99']:.3f}", "", "", None,
                f"weighted {bal[8]['weighted']:.4f} (default {base[8]['weighted']:.4f})")]
    for name in ("first", "first.metrics", "first.sorted", "none", "targets"):
        shutil.rmtree(work / name, ignore_errors=True)
    return rows
