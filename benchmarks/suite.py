"""The benchmarks, the driver and the command line of ``python -m benchmarks``."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import (
    bench_balance,
    bench_compose,
    bench_doors,
    bench_fasttok,
    bench_interop,
    bench_litdata,
    bench_loader,
    bench_media,
    bench_mixture,
    bench_multimodal,
    bench_objects,
    bench_plan_batch,
    bench_real_tokens,
    bench_scaling,
    bench_sft,
    bench_stored,
    bench_tokens_loop,
    data,
    train_payoff,
)
from .report import ROW_HEADER, Row, Section, machine, plain, render_markdown, row_cells, secs, speed
from .runner import ROOT, BenchError, sortpack_cli, timed_worker, worker

MAX_TOKENS = 500_000  # the pack figure's budget; also used by the end-to-end run
TARGET_P = 2  # the ranks the targets are stated for


@dataclass(frozen=True)
class Scale:
    """Problem sizes of one scale."""

    sort_per_rank: int  # records per rank, sortpack vs the published sample sort
    sort_total: int  # records over all ranks, sortpack vs the np.sort floor
    pack_n: int  # sorted sizes packed in one process
    run_n: int  # samples of the end-to-end run
    texts: int  # texts measured with --size length
    token_texts: int  # texts measured with --size tokens
    reader_mbs: int  # micro-batches of the reader's index
    repeats: int  # best-of repeats inside one worker process
    rounds: int  # interleaved launches of each (baseline, sortpack) worker; the best is kept
    timeout: float  # seconds per subprocess


SCALES = {
    "small": Scale(100_000, 1_000_000, 200_000, 200_000, 50_000, 5_000, 20_000, 2, 1, 180),
    "full": Scale(1_000_000, 10_000_000, 10_000_000, 10_000_000, 1_000_000, 50_000, 1_000_000, 3, 3, 1200),
}


@dataclass
class Context:
    """What every benchmark reads (scale, ranks) and adds to (sections, scaling, notes)."""

    scale_name: str
    scale: Scale
    ranks: list[int]
    threads: int = 0  # threads of the run's in-memory sort floor (0: the largest rank count)
    sections: list[Section] = field(default_factory=list)
    scaling: dict[str, dict[int, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)  # load average as each benchmark starts

    def log(self, msg: str) -> None:
        """Print a progress line."""
        print(f"  .. {msg}", flush=True)

    def time_at(self, label: str, ranks: int, seconds: float) -> None:
        """Record a timing for the P=1 -> P=k speedup table."""
        self.scaling.setdefault(label, {})[ranks] = seconds


def _millions(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 100_000 else f"{n / 1e3:g}k"


def _oversub(p: int) -> str:
    cores = os.cpu_count() or 1
    return f"oversubscribed ({p} ranks > {cores} cores)" if p > cores else ""


def interleaved(ctx: Context, jobs: dict, rounds: int) -> dict:
    """Run each job ``(kind, args, ranks[, pin_rayon])`` ``rounds`` times round-robin; keep each one's fastest.

    Alternating baseline and sortpack launches exposes both to the same background load,
    which keeps their ratio fair on a shared machine. Boolean results are and-ed over rounds.
    """
    best: dict = {}
    for r in range(rounds):
        for key, (kind, args, ranks, *pin) in jobs.items():
            res = worker(kind, args, ctx.scale.timeout, ranks, *pin)
            prev = best.get(key)
            flags = {k: v and prev[k] for k, v in res.items() if isinstance(v, bool) and prev}
            if prev is None or res["seconds"] < prev["seconds"]:
                best[key] = {**res, **flags}
            else:
                prev.update(flags)
        ctx.log(f"round {r + 1}/{rounds} done")
    return best


def bench_sort(ctx: Context) -> list[Row]:
    """Distributed sort: vs the published Python-list sample sort, and vs one np.sort."""
    s, rows = ctx.scale, []
    big_args = {"total": s.sort_total, "repeats": s.repeats}
    jobs = {"floor": ("sort_floor", big_args, None)}
    for p in ctx.ranks:
        jobs[("weak", p)] = ("sort_sortpack", {"total": s.sort_per_rank * p, "repeats": s.repeats}, p)
        jobs[("big", p)] = ("sort_sortpack", big_args, p)
        jobs[("stage", p)] = ("sort_stage", big_args, p)
    ctx.log(f"np.sort floor, sample_sort and sort_samples on {_millions(s.sort_total)} records, "
            f"sample_sort on {_millions(s.sort_per_rank)}/rank, interleaved")
    res = interleaved(ctx, jobs, s.rounds)
    floor = res["floor"]
    for p in ctx.ranks:
        total = s.sort_per_rank * p
        ctx.log(f"P={p}: published sample sort, {_millions(s.sort_per_rank)} records/rank")
        sp = res[("weak", p)]
        pub = worker("sort_published", {"total": total, "repeats": 1}, s.timeout, p)
        ratio = pub["seconds"] / sp["seconds"]
        ok = sp["sorted"] and pub["sorted"]
        rows.append(Row("sort", f"sample_sort vs published sample sort, {_millions(s.sort_per_rank)} rec/rank", p,
                        secs(sp["seconds"]), f"published: {secs(pub['seconds'])}", speed(pub["seconds"], sp["seconds"]),
                        "≥ 100×" if p == TARGET_P else "", (ratio >= 100 and ok) if p == TARGET_P else None,
                        "; ".join(x for x in ("" if ok else "OUTPUT NOT SORTED", _oversub(p)) if x)))
        big = res[("big", p)]
        ratio = big["seconds"] / floor["seconds"]
        rows.append(Row("sort", f"sample_sort, {_millions(s.sort_total)} records in all, vs one np.sort", p,
                        secs(big["seconds"]), f"np.sort floor: {secs(floor['seconds'])}", f"{ratio:.2f}× floor",
                        "≤ 1.5×" if p == TARGET_P else "", (ratio <= 1.5 and big["sorted"]) if p == TARGET_P else None,
                        "; ".join(x for x in (f"Alltoallv {big['alltoallv_bytes_max'] / 1e6:.0f} MB/rank" if p > 1
                                              else "", "" if big["sorted"] else "OUTPUT NOT SORTED", _oversub(p))
                                  if x)))
        stage = res[("stage", p)]
        rows.append(Row("sort", f"sort_samples (whole stage: sizes payload + redistribution), "
                                f"{_millions(s.sort_total)}", p, secs(stage["seconds"]),
                        f"np.sort floor: {secs(floor['seconds'])}", f"{stage['seconds'] / floor['seconds']:.2f}× floor",
                        note=f"Alltoallv {stage['alltoallv_bytes_max'] / 1e6:.0f} MB/rank" if p > 1 else ""))
        ctx.time_at(f"sort: sample_sort, {_millions(s.sort_total)} records", p, big["seconds"])
        ctx.time_at(f"sort: sort_samples stage, {_millions(s.sort_total)}", p, stage["seconds"])
    return rows


def _compiled_kernels() -> bool:
    from sortpack import kernels

    backend = getattr(kernels, "backend", None)
    return backend is not None and backend() == "c"


def bench_pack(ctx: Context) -> list[Row]:
    """Greedy packing of sorted sizes in one process: kernels.greedy_pack vs oracle and numpy."""
    s = ctx.scale
    compiled = _compiled_kernels()
    ctx.log(f"greedy_pack on {_millions(s.pack_n)} sorted sizes ({'compiled' if compiled else 'Python reference'})")
    r = worker("pack", {"n": s.pack_n, "max_tokens": MAX_TOKENS, "repeats": s.repeats,
                        "repeats_kernel": s.repeats if compiled else 1}, s.timeout)
    per10m = r["kernel_s"] * 1e7 / r["n"]
    same = r["kernel_equal"]
    check = "full data" if r["oracle_n"] == r["n"] else f"first {_millions(r['oracle_n'])}"
    kind = "compiled C kernel" if r["compiled"] else "numpy/Python fallback kernel (C kernels not built)"
    oracle_scaled = r["oracle_s"] * r["n"] / r["oracle_n"]
    return [
        Row("pack", f"greedy_pack, {_millions(r['n'])} sorted sizes U(128..4096), budget {MAX_TOKENS}", 1,
            f"{secs(r['kernel_s'])} ({per10m * 1e3:.0f} ms per 10M)",
            f"Python oracle: {secs(oracle_scaled)}", speed(oracle_scaled, r["kernel_s"]),
            "≤ 75 ms per 10M, == oracle", per10m <= 0.075 and same,
            f"{kind}; {r['microbatches']} micro-batches; equal to oracle on {check}: {'yes' if same else 'NO'}"),
        Row("pack", "greedy_pack vs numpy vectorised greedy (same sizes)", 1, secs(r["kernel_s"]),
            f"numpy greedy: {secs(r['numpy_s'])}", speed(r["numpy_s"], r["kernel_s"]),
            note=f"numpy greedy equal to oracle: {'yes' if r['numpy_equal'] else 'NO'}"),
        # the tokens budget has a loop of its own as the padded one does (it ran 1.2-1.7x slower in the general one)
        Row("pack", "greedy_pack, tokens budget (same sizes and budget)", 1, secs(r["tokens_s"]),
            f"padded budget: {secs(r['kernel_s'])}", f"{r['tokens_s'] / r['kernel_s']:.2f}× padded",
            "≤ 1.25× the padded budget, == oracle",
            (r["tokens_s"] <= 1.25 * r["kernel_s"] and r["tokens_equal"]) if r["compiled"] else None,
            f"equal to the tokens oracle on {check}: {'yes' if r['tokens_equal'] else 'NO'}"),
    ]


def _run_index(ctx: Context, inputs: Path, out: Path, p: int, extra: list[str]) -> tuple[float, dict]:
    """Run ``sortpack run`` under P ranks; return (wall seconds, manifest)."""
    wall = sortpack_cli(["run", str(inputs), "-o", str(out), "--size", "column:ntokens", "--overwrite", "--quiet"]
                        + extra, ctx.scale.timeout, p)
    return wall, json.loads((out / "manifest.json").read_text())


def bench_run(ctx: Context) -> list[Row]:
    """``sortpack run`` end to end from Parquet vs the I/O floor; per-stage profile; peak RSS."""
    s, rows = ctx.scale, []
    ctx.log(f"generating {_millions(s.run_n)} sizes as Parquet")
    inputs = data.size_parquet(s.run_n)
    out_dir = data.work_dir("out")
    ctx.log("I/O floor: read the column, write one Arrow IPC file (alone, and as a whole command)")
    floor_args = {"dir": str(inputs), "column": "ntokens", "out": str(out_dir / "floor.arrow")}
    floor = worker("io_floor", {**floor_args, "repeats": s.repeats}, s.timeout)
    # like for like with a whole `sortpack run`: interpreter start, imports, then the I/O;
    # floor and runs alternate over rounds so that both see the same background load
    floor_cmd, best = float("inf"), {}
    for r in range(s.rounds):
        floor_cmd = min(floor_cmd, timed_worker("io_floor", {**floor_args, "repeats": 1}, s.timeout)[0])
        for p in ctx.ranks:
            ctx.log(f"round {r + 1}/{s.rounds}, P={p}: sortpack run, {_millions(s.run_n)} samples")
            wall, man = _run_index(ctx, inputs, out_dir / f"run-P{p}", p, ["--max-tokens", str(MAX_TOKENS)])
            if p not in best or wall < best[p][0]:
                best[p] = (wall, man)
    prof = Section(f"`sortpack run` stage profile, {_millions(s.run_n)} samples (manifest provenance.profile of "
                   "the fastest round, max over ranks)",
                   ["P", "stage", "wall", "Alltoallv MB (max rank)", "Alltoallv MB (total)"])
    hashes = {}
    for p in ctx.ranks:
        wall, man = best[p]
        hashes[p] = man["content_hash"]
        profile = man["provenance"]["profile"]
        ratio = wall / floor_cmd
        rows.append(Row("run", f"sortpack run, {_millions(s.run_n)} samples, Parquet, --size column:ntokens", p,
                        secs(wall), f"I/O floor command: {secs(floor_cmd)} (its I/O alone: {secs(floor['seconds'])})",
                        f"{ratio:.1f}× floor", "≤ 2×" if p == TARGET_P else "", ratio <= 2 if p == TARGET_P else None,
                        "; ".join(x for x in (f"{wall / floor['seconds']:.0f}× the I/O alone",
                                              f"{man['num_microbatches']} micro-batches", _oversub(p)) if x)))
        stage_sum = 0.0
        for name, v in profile.items():
            if isinstance(v, dict):
                stage_sum += v["wall_s"]
                prof.rows.append([str(p), name, secs(v["wall_s"]), f"{v['alltoallv_bytes_max'] / 1e6:.1f}",
                                  f"{v['alltoallv_bytes_total'] / 1e6:.1f}"])
                ctx.time_at(f"run: {name}", p, v["wall_s"])
        prof.rows.append([str(p), "(rest: launch, imports, work outside the profiled stages)",
                          secs(wall - stage_sum), "", ""])
        ctx.time_at("run: whole command", p, wall)
        rss = max(profile["peak_rss_bytes_per_rank"])
        limit = 48 * s.run_n / p + 150e6
        rows.append(Row("run", f"peak RSS per rank in run, N={_millions(s.run_n)}", p, f"{rss / 1e6:.0f} MB",
                        f"48 B × N/P + 150 MB = {limit / 1e6:.0f} MB", f"{rss / limit:.2f}× limit",
                        "≤ 48 B × N/P + 150 MB", rss <= limit,
                        "per rank: " + ", ".join(f"{x / 1e6:.0f}" for x in profile["peak_rss_bytes_per_rank"])
                        + " MB" + (f" ({(rss - 150e6) / (s.run_n / p):.0f} B/sample above 150 MB)" if rss > 150e6
                                   else "")))
    ctx.sections.append(prof)
    threads = ctx.threads or max(ctx.ranks)
    ctx.log(f"sort floor: {threads} threads each np.sort 1/{threads} of the {_millions(s.run_n)} keys")
    sfloor = worker("sort_floor_threads", {"total": s.run_n, "threads": threads, "repeats": s.repeats}, s.timeout)
    for p in ctx.ranks:
        sort_s = best[p][1]["provenance"]["profile"].get("sort", {}).get("wall_s")
        if sort_s is not None:
            rows.append(Row("run", f"run's sort stage vs a {threads}-thread in-memory sort floor, "
                            f"{_millions(s.run_n)} keys", p, secs(sort_s), f"floor: {secs(sfloor['seconds'])}",
                            f"{sort_s / sfloor['seconds']:.1f}× floor", "", None,
                            f"floor = {threads} threads concurrently np.sort N/{threads} uint64 keys each, "
                            "no merge (a lower bound of any parallel sort)"))
    if len(hashes) > 1:
        same = len(set(hashes.values())) == 1
        ctx.notes.append(f"`run` content_hash {'identical' if same else 'DIFFERS'} across P = "
                         f"{', '.join(map(str, hashes))} (determinism check).")
    shutil.rmtree(out_dir, ignore_errors=True)
    return rows


def bench_analyze(ctx: Context) -> list[Row]:
    """``analyze --size length`` of a string column vs read + pyarrow.compute.utf8_length."""
    s, rows = ctx.scale, []
    ctx.log(f"generating {_millions(s.texts)} texts as Parquet")
    path = data.text_parquet(s.texts)
    args = {"path": str(path), "column": "text", "repeats": s.repeats}
    jobs = {"base": ("utf8_length", args, None)}
    jobs.update({p: ("analyze", {**args, "size": "length"}, p) for p in ctx.ranks})
    ctx.log("baseline (read + utf8_length, one thread) and analyze --size length, interleaved")
    res = interleaved(ctx, jobs, s.rounds)
    base = res["base"]
    for p in ctx.ranks:
        r = res[p]
        same = r["size_sum"] == base["size_sum"] and r["samples"] == base["samples"]
        ratio = r["seconds"] / base["seconds"]
        rows.append(Row("analyze", f"analyze --size length, {_millions(s.texts)} texts (Parquet)", p,
                        secs(r["seconds"]), f"read + utf8_length: {secs(base['seconds'])}", f"{ratio:.2f}× baseline",
                        "≤ 1.2×" if p == 1 else "", ratio <= 1.2 if p == 1 else None,
                        "; ".join(x for x in ("" if same else "SIZES DIFFER FROM BASELINE", _oversub(p)) if x)))
        ctx.time_at("analyze --size length", p, r["seconds"])
    return rows


def bench_tokens(ctx: Context) -> list[Row]:
    """``analyze --size tokens`` vs ``Tokenizer.encode_batch`` in one process, scaling with ranks; then real
    vocabularies on real mixed-language text (``bench_real_tokens``)."""
    return _tokens_scaling(ctx) + bench_real_tokens.bench(ctx)


def _tokens_scaling(ctx: Context) -> list[Row]:
    """``analyze --size tokens`` vs ``Tokenizer.encode_batch`` in one process; scaling with ranks."""
    s, rows = ctx.scale, []
    if importlib.util.find_spec("tokenizers") is None:
        return [Row("tokens", "analyze --size tokens", None, "skipped", note="tokenizers is not installed")]
    ctx.log(f"generating {_millions(s.token_texts)} texts and training a BPE tokenizer locally")
    path = data.text_parquet(s.token_texts)
    tok = data.tokenizer_file(path)
    args = {"path": str(path), "column": "text", "tokenizer": str(tok), "repeats": 1}
    jobs = {"base": ("encode", args, None), "wide": ("encode", args, None, False)}
    jobs.update({p: ("analyze", {**args, "size": "tokens"}, p) for p in ctx.ranks})
    p2 = next((p for p in ctx.ranks if p > 1), None)
    if p2 is not None:
        jobs["loose"] = ("analyze", {**args, "size": "tokens"}, p2, False)
    ctx.log("baseline (Tokenizer.encode_batch, one process) and analyze --size tokens, interleaved")
    res = interleaved(ctx, jobs, s.rounds)
    base, wide = res["base"], res["wide"]
    cores = os.cpu_count() or 1
    per_p = {}
    for p in ctx.ranks:
        r = res[p]
        per_p[p] = r["seconds"]
        same = r["size_sum"] == base["size_sum"] and r["samples"] == base["samples"]
        ratio = base["seconds"] / r["seconds"]
        want = 0.9 * min(p, cores)
        rows.append(Row("tokens", f"analyze --size tokens, {_millions(s.token_texts)} texts, BPE 8k (throughput)", p,
                        secs(r["seconds"]), f"encode_batch 1 thread: {secs(base['seconds'])}",
                        f"{ratio:.2f}× baseline throughput", f"≥ {want:.1f}× (0.9 × min(P, cores))",
                        ratio >= want,
                        "; ".join(x for x in ("" if same else "TOKEN COUNTS DIFFER FROM BASELINE", _oversub(p)) if x)))
        ctx.time_at("analyze --size tokens", p, r["seconds"])
    ctx.notes.append(f"tokens: encode_batch with the library's default thread pool ({cores} threads) took "
                     f"{secs(wide['seconds'])} vs {secs(base['seconds'])} pinned to one thread; every rank here "
                     "runs with RAYON_NUM_THREADS=1 (one thread per rank).")
    if p2 is not None:
        loose = res["loose"]
        rows.append(Row("tokens", "same, RAYON_NUM_THREADS left to the library default (what pinning saves)", p2,
                        secs(loose["seconds"]), f"pinned, same P: {secs(per_p[p2])}",
                        f"{loose['seconds'] / per_p[p2]:.2f}× pinned time",
                        note=f"{p2} ranks × {cores} Rayon threads on {cores} cores"))
    return rows


def bench_reader(ctx: Context) -> list[Row]:
    """Open a large index with ``sortpack.reader.PackedIndex`` and walk a step plan (when present)."""
    s = ctx.scale
    if importlib.util.find_spec("sortpack.reader") is None:
        return [Row("reader", "reader: open index / per step", None, "skipped",
                    note="sortpack.reader is not on this branch yet")]
    # sizes U(128..4096) under a 4096 budget give about 0.69 micro-batches per sample
    n = int(s.reader_mbs / 0.69)
    inputs = data.size_parquet(n)
    out = data.work_dir("reader") / "index"
    ctx.log(f"building an index of about {_millions(s.reader_mbs)} micro-batches")
    _run_index(ctx, inputs, out, max([p for p in ctx.ranks if p <= (os.cpu_count() or 1)] or [1]),
               ["--max-tokens", "4096"])
    r = worker("reader", {"path": str(out), "world_size": 8, "grad_accum": 1, "max_steps": 100_000,
                          "repeats": s.repeats}, s.timeout)
    shutil.rmtree(out.parent, ignore_errors=True)
    if "open_s" not in r:
        return [Row("reader", "reader: open index / per step", None, "skipped", note=r.get("skipped", ""))]
    mbs = r["microbatches"]
    rows = [Row("reader", f"open PackedIndex, {_millions(mbs)} micro-batches", None, secs(r["open_s"]),
                target="≤ 50 ms", met=r["open_s"] <= 0.05, note=f"first open {secs(r['open_first_s'])}")]
    if "per_step_s" in r:
        rows.append(Row("reader", "reader per-step cost (W=8, A=1, rank 0)", None, secs(r["per_step_s"]),
                        target="≤ 20 µs", met=r["per_step_s"] <= 20e-6,
                        note=f"{r['steps']} of {r['steps_total']} steps; building the epoch plan took "
                             f"{secs(r['plan_s'])}; {r['api']}"))
    else:
        rows.append(Row("reader", "reader per-step cost", None, "skipped", note=r.get("skipped", "")))
    return rows


BENCHMARKS = {"sort": bench_sort, "pack": bench_pack, "run": bench_run, "analyze": bench_analyze,
              "tokens": bench_tokens, "reader": bench_reader, "train": train_payoff.bench,
              "loader": bench_loader.bench, "mixture": bench_mixture.bench, "stored": bench_stored.bench,
              "objects": bench_objects.bench, "scaling": bench_scaling.bench, "tokens_loop": bench_tokens_loop.bench,
              "balance": bench_balance.bench,
              "balance_targets": bench_balance.bench_targets, "compose": bench_compose.bench,
              "fasttok": bench_fasttok.bench, "sft": bench_sft.bench, "litdata": bench_litdata.bench,
              "media": bench_media.bench, "doors": bench_doors.bench,
              "plan_batch": bench_plan_batch.bench, "interop": bench_interop.bench,
              "multimodal": bench_multimodal.bench}


def _scaling_section(ctx: Context) -> Section | None:
    ps = sorted({p for t in ctx.scaling.values() for p in t})
    if len(ps) < 2 or 1 not in ps:
        return None
    others = [p for p in ps if p != 1]
    sec = Section("Scaling: P=1 → P=k speedup (time at P=1 / time at P=k)",
                  ["stage"] + [f"P={p}" for p in ps] + [f"speedup 1→{p}" for p in others])
    for label, t in ctx.scaling.items():
        cells = [secs(t[p]) if p in t else "" for p in ps]
        speed = [f"{t[1] / t[p]:.2f}×" if 1 in t and p in t and t[p] > 0 else "" for p in others]
        sec.rows.append([label] + cells + speed)
    return sec


def _load() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _parse_ranks(text: str) -> list[int]:
    try:
        ranks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ranks or ranks[0] < 1:
        raise argparse.ArgumentTypeError("ranks must be positive")
    return ranks


def main(argv: list[str] | None = None) -> int:
    """Run the suite; print the table; write the results file. Exit 1 if a benchmark failed."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--scale", choices=sorted(SCALES), default="small",
                    help="small: CI's smoke run, one round of each figure (minutes); "
                         "full: the target sizes (an hour and more)")
    ap.add_argument("--ranks", type=_parse_ranks, default=[1, 2],
                    help="comma-separated rank counts to sweep (default 1,2)")
    ap.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    ap.add_argument("--results", type=Path, help="where to write the markdown results (default: "
                    "benchmarks/RESULTS.md for a complete full-scale run, else benchmarks/_work/RESULTS-<scale>.md)")
    ap.add_argument("--samples", type=float, help="samples of the `run` benchmark (e.g. 1e9; default: the scale's)")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of the run's in-memory sort floor (default: the largest of --ranks)")
    args = ap.parse_args(argv)
    names = list(BENCHMARKS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BENCHMARKS]
        if unknown:
            ap.error(f"--only: unknown benchmark {unknown[0]!r} (choose from {', '.join(BENCHMARKS)})")
    command = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv)
    scale = SCALES[args.scale]
    if args.samples:
        # a big run: give each sortpack command time to finish (about 2 minutes per 100M samples at P=1)
        n = int(args.samples)
        scale = dataclasses.replace(scale, run_n=n, timeout=max(scale.timeout, 1.5e-6 * n * 1.3 + 300))
    ctx = Context(args.scale, scale, args.ranks, threads=args.threads)
    rows: list[Row] = []
    failed = False
    t_start = time.perf_counter()
    load_start = _load()
    print(f"sortpack benchmarks, scale {args.scale}, ranks {','.join(map(str, args.ranks))}", flush=True)
    for name in names:
        print(f"[{name}]", flush=True)
        ctx.loads.append(f"{name} {_load()}")
        t0 = time.perf_counter()
        try:
            rows += BENCHMARKS[name](ctx)
        except BenchError as exc:
            failed = True
            first, *rest = str(exc).splitlines() or ["failed"]
            print(f"  !! {name} failed: {exc}", flush=True)
            rows.append(Row(name, f"{name}: ERROR", None, "error", note=first[:200]))
        print(f"  done in {time.perf_counter() - t0:.1f} s", flush=True)
    elapsed = time.perf_counter() - t_start
    ctx.notes.append(f"load average (1/5/15 min) at start {load_start}, at end {_load()}, as each benchmark "
                     f"started: {'; '.join(ctx.loads)} ({os.cpu_count()} cores). Load from other work on the "
                     "machine inflates and scatters timings, multi-rank ones most.")
    scaling = _scaling_section(ctx)
    sections = ctx.sections + ([scaling] if scaling else [])

    print()
    print(plain(ROW_HEADER, [row_cells(r) for r in rows]))
    for sec in sections:
        print(f"\n{sec.title}\n" + plain(sec.header, sec.rows))
    for note in ctx.notes:
        print(f"note: {note}")
    target = args.results
    if target is None:
        complete = args.scale == "full" and not args.only
        target = (ROOT / "benchmarks" / "RESULTS.md") if complete else data.WORK / f"RESULTS-{args.scale}.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_markdown(machine(ROOT), command, args.scale, rows, sections, ctx.notes, elapsed))
    print(f"\nwrote {target} ({elapsed:.0f} s)")
    return 1 if failed else 0
