"""Do ranks pay for themselves? P=1 against P=2 on one node, side by side in one run.

Two tables and their P2/P1 ratios:

- ``sortpack run DIR --size column:ntokens --max-tokens 500000 --profile`` of 20M and 60M
  samples (``--scale small``: 1M), P=1 and P=2 launched alternately, best of 3 (small: 1) by
  whole-command wall time: the sort stage split into its phases (``provenance.profile``), the
  other stages, the start-up (process start to the first stage) and the whole command.
- ``sortpack analyze --size tokens`` of real text (the standard library's source, one row per
  function or class, from ``examples/make_stdlib_dataset.py``) with a byte-level BPE
  ``tokenizer.json`` trained here with the ``tokenizers`` library, at P=1 and P=2, against one
  ``Tokenizer.encode_batch`` of the same texts (already in memory, the library's default thread
  pool) in one process, launched alternately with them. Neither side pins ``RAYON_NUM_THREADS``:
  sortpack sizes the tokenizer's pool itself (ranks x threads = cores).

Goals on a 2-core machine: sort at P=2 <= 0.6x P=1 at 60M, whole run <= 0.7x, start-up
<= 0.3 s, tokens analyze >= 1x encode_batch's throughput at every P. Each figure carries the
1-minute load average seen when its best run started: the machine may be shared.

Two more tables, each alternated in one run (``--only keep``, ``--only weak``):

- ``keep``: the 60M run (small: 1M) with the measurements kept for a failure (the default)
  against the same run with ``SORTPACK_NO_KEEP=1`` (nothing kept): whole-command wall and CPU
  time, and the ``keep_measurements`` stage. Goal: within 5% of the run without it.
- ``weak``: weak scaling, 62.5M samples per rank (small: 1M): one rank on N against two ranks
  on 2N, with every second of the wall accounted for: start-up, each stage, the time between
  stages (``outside_stages_s``), and the launch plus the exit (the launcher's wall minus the
  profile's ``process_s``), with the CPU time of all ranks and each P's peak memory per rank.
  Goals: 2 ranks on 2N within 1.25x one rank on N, and the 62.5M-per-rank run at most 7 s.
  Every run starts from warm memory: just before it, this process touches and frees as much
  memory as the run will use (24 bytes a sample, all ranks). On a virtual machine whose balloon
  reports free pages to the host (virtio ``free page reporting``: memory free for about two
  seconds goes back to the hypervisor), a page touched again costs 1-3 s of system time per GB;
  alternated, the one-rank run would always start on the 2.2 GB the two-rank run had just
  freed and the two-rank run on half cold memory, which measures the order of the runs, not
  the ranks. Both starting warm compare them as on a machine without a balloon (bare metal).
  When the host takes pages back is not for a guest to say, so no cold figure is controlled;
  each round's log line gives the system time, where cold memory shows. The table's last row
  times a memory-bound numpy loop alone and two copies at once: what sharing the node's memory
  costs any two processes, the floor under the ratio on that machine.

The checkout's modules are compiled to bytecode first (``compileall``), as an installed
package's are: where ``PYTHONDONTWRITEBYTECODE`` is set, a checkout run from source would
otherwise compile about 90 modules in every rank of every command (about 0.1 s of CPU).

    PYTHONPATH=$PWD python -m benchmarks.bench_scaling --scale full      # the full-size tables
    PYTHONPATH=$PWD python -m benchmarks --only scaling --scale small    # in the suite (CI)
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import data
from .report import Row, Section, print_script_results, script_log, secs
from .runner import ROOT, BenchError, bench_env, launch, mpiexec, timed_worker

MAX_TOKENS = 500_000
SIZES = {"small": [1_000_000], "full": [20_000_000, 60_000_000]}
TEXTS = {"small": 1500, "full": 0}  # rows of the stdlib dataset tokenized (0: all of them)
ROUNDS = {"small": 1, "full": 3}
RANKS = (1, 2)
SORT_TARGET, RUN_TARGET, STARTUP_TARGET = 0.6, 0.7, 0.3
TIMEOUT = 1200
# the sort's phases in the order they run (manifests store keys sorted)
PHASES = ["keys", "local sort", "splitters", "exchange", "merge", "decode", "redistribute"]


def _load1() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _run(inputs: Path, out: Path, p: int) -> dict:
    """Return one ``sortpack run`` at P ranks: wall seconds, the manifest's profile and hash, the load at start."""
    load = _load1()
    wall, _ = launch([sys.executable, "-m", "sortpack", "run", str(inputs), "-o", str(out), "--size",
                      "column:ntokens", "--max-tokens", str(MAX_TOKENS), "--profile", "--overwrite", "--quiet"],
                     TIMEOUT, p, pin_rayon=False)
    man = json.loads((out / "manifest.json").read_text())
    return {"wall": wall, "profile": man["provenance"]["profile"], "hash": man["content_hash"], "load": load}


KEEP_N = {"small": 1_000_000, "full": 60_000_000}
WEAK_N = {"small": 1_000_000, "full": 62_500_000}  # samples per rank
KEEP_TARGET, WEAK_TARGET, WEAK_SECONDS = 1.05, 1.25, 7.0
WEAK_WARM_BYTES = 24  # per sample, all ranks: a rank's peak (about 19 bytes a sample) and the files it writes


def compile_checkout() -> None:
    """Compile the checkout's modules to bytecode once, as an installed package's are."""
    compileall.compile_dir(str(ROOT / "sortpack"), quiet=1)


def _timed_run(inputs: Path, out: Path, p: int, env: dict | None = None) -> dict:
    """Return one ``sortpack run --profile`` at P ranks: wall and CPU seconds (all ranks), profile, load at start.

    The previous round's output is removed first, outside the timing: ``--overwrite`` would
    otherwise charge each run for deleting the last one's shards (0.07 s at 62.5M, twice that on 125M).
    """
    shutil.rmtree(out, ignore_errors=True)
    load = _load1()
    cmd = [mpiexec(), "-n", str(p), sys.executable, "-m", "sortpack", "run", str(inputs), "-o", str(out), "--size",
           "column:ntokens", "--max-tokens", str(MAX_TOKENS), "--profile", "--overwrite", "--quiet"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**bench_env(False), **(env or {})}, capture_output=True, text=True,
                          timeout=TIMEOUT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise BenchError(f"exit {proc.returncode}: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    man = json.loads((out / "manifest.json").read_text())
    return {"wall": wall, "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime,
            "profile": man["provenance"]["profile"], "hash": man["content_hash"], "load": load}


def _stage_sum(prof: dict) -> float:
    return sum(v["wall_s"] for v in prof.values() if isinstance(v, dict))


def bench_keep(scale: str, log) -> tuple[list[Section], list[Row]]:
    """Alternate the run with its kept measurements and without; return the table and the goal row."""
    n = KEEP_N[scale]
    inputs, out = data.size_parquet(n), data.work_dir("scaling-keep")
    runs: dict = {"kept": [], "off": []}
    for r in range(max(ROUNDS[scale], 2)):
        for name, env in (("kept", {}), ("off", {"SORTPACK_NO_KEEP": "1"})):
            res = _timed_run(inputs, out / name, 1, env)
            log(f"round {r + 1}, {n / 1e6:g}M, measurements {name}: {res['wall']:.2f} s, CPU "
                f"{res['user'] + res['sys']:.2f} s (load {res['load']:.1f})")
            runs[name].append(res)
    shutil.rmtree(out, ignore_errors=True)
    best = {k: min(v, key=lambda x: x["wall"]) for k, v in runs.items()}
    cpu = {k: min(x["user"] + x["sys"] for x in v) for k, v in runs.items()}
    keep_stage = min(x["profile"].get("keep_measurements", {}).get("wall_s", 0.0) for x in runs["kept"])
    sec = Section(f"kept measurements, sortpack run of {n / 1e6:g}M samples, P=1, alternated "
                  f"(best of {len(runs['kept'])})", ["figure", "kept (default)", "SORTPACK_NO_KEEP=1", "ratio",
                                                     "load"])
    load = f"{best['kept']['load']:.1f} / {best['off']['load']:.1f}"
    sec.rows += [["whole command wall", secs(best["kept"]["wall"]), secs(best["off"]["wall"]),
                  f"{best['kept']['wall'] / best['off']['wall']:.3f}", load],
                 ["whole command CPU (user+sys)", secs(cpu["kept"]), secs(cpu["off"]),
                  f"{cpu['kept'] / cpu['off']:.3f}", load],
                 ["keep_measurements stage", secs(keep_stage), "", "", load]]
    ratio = best["kept"]["wall"] / best["off"]["wall"]
    rows = [Row("scaling", f"run with kept measurements / without, {n / 1e6:g}M samples", 1,
                secs(best["kept"]["wall"]), f"without: {secs(best['off']['wall'])}", f"{ratio:.3f}×",
                f"≤ {KEEP_TARGET}×", ratio <= KEEP_TARGET,
                f"CPU {cpu['kept'] / cpu['off']:.3f}×; keep_measurements stage {secs(keep_stage)}; load {load}")]
    return [sec], rows


def warm_memory(nbytes: int) -> float:
    """Touch ``nbytes`` of fresh memory once and free it; return the seconds it took.

    Freed pages go to the head of the kernel's free lists, so the next process's first
    ``nbytes`` come from memory touched a moment ago rather than memory the hypervisor took back.
    """
    import numpy as np

    t0 = time.perf_counter()
    block = np.empty(nbytes, np.uint8)
    block[::4096] = 1  # one write per page faults it in: the kernel zeroes the rest
    del block
    return time.perf_counter() - t0


# one process's memory-bound work on n int64s: what two ranks share on one node is the memory bus
_BUS_WORK = """
import sys, time, numpy as np
n = int(sys.argv[1])
a = np.arange(n, dtype=np.int64); b = np.empty_like(a)
t = time.perf_counter()
for _ in range(4):
    np.add(a, 1, out=b); np.maximum(b, a, out=a); np.bitwise_and(a, 0xFFFF, out=b); int(b.max())
print(time.perf_counter() - t)
"""


def bus_floor(n: int) -> tuple[float, float]:
    """Return the seconds of a memory-bound numpy loop over ``n`` int64s alone, and of two at once (the slower).

    Their ratio is what sharing the node's memory costs any two processes, sortpack's ranks or
    not: the floor under the weak-scaling ratio on this machine.
    """
    def run(copies: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", _BUS_WORK, str(n)], stdout=subprocess.PIPE, text=True,
                                  env=bench_env(False)) for _ in range(copies)]
        return max(float(pr.communicate(timeout=TIMEOUT)[0]) for pr in procs)

    alone, together = [], []
    for _ in range(3):
        alone.append(run(1))
        together.append(run(2))
    return min(alone), min(together)


def bench_weak(scale: str, log) -> tuple[list[Section], list[Row]]:
    """Alternate one rank on N and two ranks on 2N; return the accounted wall table and the goal rows."""
    n = WEAK_N[scale]
    data_for = {1: data.size_parquet(n), 2: data.size_parquet(2 * n)}
    out = data.work_dir("scaling-weak")
    runs: dict = {1: [], 2: []}
    for r in range(ROUNDS[scale]):
        for p in (1, 2):
            warmed = warm_memory(WEAK_WARM_BYTES * p * n)
            res = _timed_run(data_for[p], out / f"P{p}", p)
            log(f"round {r + 1}, weak P={p} on {p * n / 1e6:g}M: {res['wall']:.2f} s, CPU "
                f"{res['user'] + res['sys']:.2f} s, of it system {res['sys']:.2f} s (load {res['load']:.1f}; "
                f"{WEAK_WARM_BYTES * p * n / 2**30:.2f} GiB warmed in {warmed:.2f} s)")
            runs[p].append(res)
    shutil.rmtree(out, ignore_errors=True)
    best = {p: min(v, key=lambda x: x["wall"]) for p, v in runs.items()}
    sec = Section(f"weak scaling, {n / 1e6:g}M samples per rank, --size column:ntokens (fastest round of each; "
                  "max over ranks)", ["part", "P=1 on N", "P=2 on 2N", "P2/P1"])

    def row(name: str, a: float, b: float) -> None:
        sec.rows.append([name, secs(a), secs(b), f"{b / a:.2f}" if a else ""])

    pr = {p: best[p]["profile"] for p in (1, 2)}
    for name in [k for k, v in pr[1].items() if isinstance(v, dict)]:
        row(name, pr[1][name]["wall_s"], pr[2].get(name, {}).get("wall_s", 0.0))
    row("start-up (process start to the first stage)", pr[1]["startup_s"], pr[2]["startup_s"])
    row("between stages (outside_stages_s)", pr[1]["outside_stages_s"], pr[2]["outside_stages_s"])
    row("launch, manifest rename and exit (wall - process_s)", best[1]["wall"] - pr[1]["process_s"],
        best[2]["wall"] - pr[2]["process_s"])
    row("whole command (mpiexec launch to exit)", best[1]["wall"], best[2]["wall"])
    row("CPU, all ranks (user)", best[1]["user"], best[2]["user"])
    row("CPU, all ranks (sys)", best[1]["sys"], best[2]["sys"])
    # the largest over the rounds: a rank's peak does not depend on the load
    peak = {p: max(x["profile"]["peak_rss_bytes_max"] for x in runs[p]) for p in (1, 2)}
    sec.rows.append(["peak memory per rank (max over ranks and rounds)", f"{peak[1] / 2**30:.2f} GiB",
                     f"{peak[2] / 2**30:.2f} GiB", f"{peak[2] / peak[1]:.2f}"])
    sec.rows.append(["load at start", f"{best[1]['load']:.1f}", f"{best[2]['load']:.1f}", ""])
    alone, together = bus_floor(min(n, 1 << 24))
    row("numpy alone / two at once, memory-bound (the machine's floor)", alone, together)
    ratio = best[2]["wall"] / best[1]["wall"]
    load = f"load {best[1]['load']:.1f} / {best[2]['load']:.1f}"
    memory = f"peak per rank {peak[1] / 2**30:.2f} / {peak[2] / 2**30:.2f} GiB"
    rows = [Row("scaling", f"weak scaling: P=2 on {2 * n / 1e6:g}M / P=1 on {n / 1e6:g}M", 2, secs(best[2]["wall"]),
                f"P=1: {secs(best[1]['wall'])}", f"{ratio:.2f}×", f"≤ {WEAK_TARGET}×", ratio <= WEAK_TARGET,
                f"warm start; two numpy processes at once {together / alone:.2f}×; {load}; {memory}"),
            Row("scaling", f"whole run, {n / 1e6:g}M samples per rank", 1, secs(best[1]["wall"]), "",
                "", f"≤ {WEAK_SECONDS:g} s", best[1]["wall"] <= WEAK_SECONDS if scale == "full" else None, load)]
    return [sec], rows


def _ratio(a: float | None, b: float | None) -> str:
    return f"{b / a:.2f}" if a and b is not None else ""


def _best_of(runs: list[dict]) -> dict:
    """Return the rounds' best figure per part: each stage, phase, start-up and the whole command at its minimum."""
    best = min(runs, key=lambda r: r["wall"])
    prof: dict = {}
    for name, v in best["profile"].items():
        if isinstance(v, dict):
            got = [r["profile"][name] for r in runs if name in r["profile"]]
            prof[name] = {"wall_s": min(g["wall_s"] for g in got),
                          "phases": {ph: min(g.get("phases", {}).get(ph, float("inf")) for g in got)
                                     for ph in v.get("phases", {})}}
    ups = [r["profile"].get("startup_s") for r in runs]
    prof["startup_s"] = None if None in ups else min(ups)
    return {**best, "profile": prof}


def sort_section(n: int, rounds: dict) -> tuple[Section, dict]:
    """Return the per-phase table of P=1 and P=2 runs of ``n`` samples (best of the rounds per part), and ratios."""
    p1, p2 = _best_of(rounds[1]), _best_of(rounds[2])
    sec = Section(f"sortpack run, {n / 1e6:g}M samples, --size column:ntokens --max-tokens {MAX_TOKENS} "
                  f"(each part: best of the alternated rounds; max over ranks)",
                  ["part", "P=1", "P=2", "P2/P1", "load at P=1 / P=2 run"])
    load = f"{p1['load']:.1f} / {p2['load']:.1f}"

    def row(name: str, a: float | None, b: float | None) -> None:
        sec.rows.append([name, secs(a) if a is not None else "", secs(b) if b is not None else "", _ratio(a, b),
                         load])

    stages = [k for k, v in p1["profile"].items() if isinstance(v, dict)]
    for name in stages:
        a, b = p1["profile"][name], p2["profile"].get(name, {})
        row(name, a["wall_s"], b.get("wall_s"))
        found = {*b.get("phases", {}), *a.get("phases", {})}
        phases = [ph for ph in PHASES if ph in found] + sorted(found - set(PHASES))
        for ph in phases:
            row(f"  {name}: {ph}", a.get("phases", {}).get(ph), b.get("phases", {}).get(ph))
    row("start-up (process start to first stage)", p1["profile"].get("startup_s"), p2["profile"].get("startup_s"))
    row("whole command (mpiexec launch to exit)", p1["wall"], p2["wall"])
    ups = [p["profile"].get("startup_s") for p in (p1, p2)]
    ratios = {"sort": p2["profile"]["sort"]["wall_s"] / p1["profile"]["sort"]["wall_s"],
              "run": p2["wall"] / p1["wall"], "startup": None if None in ups else max(ups),
              "same": p1["hash"] == p2["hash"]}
    return sec, ratios


def bench_sort(scale: str, log) -> tuple[list[Section], list[Row]]:
    """Alternate P=1 and P=2 runs per size; return the tables and the goal rows."""
    sections, rows = [], []
    for n in SIZES[scale]:
        log(f"{n / 1e6:g}M sizes as Parquet")
        inputs = data.size_parquet(n)
        out = data.work_dir("scaling-out")
        runs: dict = {p: [] for p in RANKS}
        for r in range(ROUNDS[scale]):
            for p in RANKS:
                res = _run(inputs, out / f"P{p}", p)
                log(f"round {r + 1}, {n / 1e6:g}M, P={p}: {res['wall']:.2f} s, sort "
                    f"{res['profile']['sort']['wall_s']:.2f} s (load {res['load']:.1f})")
                runs[p].append(res)
        shutil.rmtree(out, ignore_errors=True)
        sec, q = sort_section(n, runs)
        best = {p: _best_of(runs[p]) for p in RANKS}
        sections.append(sec)
        label = f"{n / 1e6:g}M samples"
        load = f"load {best[1]['load']:.1f} / {best[2]['load']:.1f}"
        rows += [
            Row("scaling", f"sort stage P=2 / P=1, {label}", 2, secs(best[2]["profile"]["sort"]["wall_s"]),
                f"P=1: {secs(best[1]['profile']['sort']['wall_s'])}", f"{q['sort']:.2f}×", f"≤ {SORT_TARGET}×",
                q["sort"] <= SORT_TARGET, load),
            Row("scaling", f"whole run P=2 / P=1, {label}", 2, secs(best[2]["wall"]), f"P=1: {secs(best[1]['wall'])}",
                f"{q['run']:.2f}×", f"≤ {RUN_TARGET}×", q["run"] <= RUN_TARGET,
                f"{load}; content_hash {'identical' if q['same'] else 'DIFFERS'} at P=1 and P=2"),
            Row("scaling", f"start-up (process start to the first stage), {label}", None,
                "not recorded" if q["startup"] is None else secs(q["startup"]), target=f"≤ {STARTUP_TARGET} s",
                met=None if q["startup"] is None else q["startup"] <= STARTUP_TARGET,
                note=f"max over P and ranks; {load}"),
        ]
    return sections, rows


def stdlib_texts(rows: int) -> Path:
    """Return a directory of Parquet text (the stdlib's functions and classes), ``rows`` of them (0: all)."""
    full = data.WORK / "stdlib"
    if not (full / "_done").is_file():
        subprocess.run([sys.executable, str(ROOT / "examples" / "make_stdlib_dataset.py"), str(full),
                        "--max-files", "100000", "--shards", "8"], check=True, capture_output=True)
        (full / "_done").write_text("")
    if not rows:
        return full
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    part = data.WORK / f"stdlib-{rows}"
    if not (part / "_done").is_file():
        part.mkdir(parents=True, exist_ok=True)
        table = ds.dataset(str(full), format="parquet").head(rows, columns=["text"])
        # two files of a few row groups: analyze deals whole row groups to ranks
        half = rows // 2
        for i, (a, b) in enumerate(((0, half), (half, rows))):
            pq.write_table(table.slice(a, b - a), part / f"part-{i}.parquet", row_group_size=max((b - a) // 4, 1))
        (part / "_done").write_text("")
    return part


def bpe_tokenizer(texts: Path, vocab: int = 8000, train_rows: int = 3000) -> Path:
    """Return a byte-level BPE ``tokenizer.json`` trained here on the first ``train_rows`` texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = data.WORK / f"stdlib-bpe-{vocab}.json"
    if path.is_file():
        return path
    import pyarrow.dataset as ds

    sample = ds.dataset(str(texts), format="parquet").head(train_rows, columns=["text"])["text"].to_pylist()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(sample, trainer=trainer)
    tok.save(str(path))
    return path


def bench_tokens(scale: str, log, texts_n: int | None = None) -> tuple[list[Section], list[Row]]:
    """Alternate encode_batch and ``analyze --size tokens`` at P=1, P=2; return the table and goal rows."""
    import importlib.util

    if importlib.util.find_spec("tokenizers") is None:
        return [], [Row("scaling", "analyze --size tokens vs encode_batch", None, "skipped",
                        note="tokenizers is not installed")]
    texts = stdlib_texts(TEXTS[scale] if texts_n is None else texts_n)
    tok = bpe_tokenizer(texts)
    out = data.work_dir("scaling-tokens")
    best: dict = {}
    for r in range(ROUNDS[scale]):
        load = _load1()
        wall, res = timed_worker("encode", {"path": str(texts), "column": "text", "tokenizer": str(tok),
                                            "repeats": 1}, TIMEOUT, None, False)
        if "base" not in best or res["seconds"] < best["base"]["seconds"]:
            best["base"] = {**res, "load": load}
        log(f"round {r + 1}: encode_batch {res['seconds']:.2f} s (load {load:.1f})")
        for p in RANKS:
            load = _load1()
            wall, _ = launch([sys.executable, "-m", "sortpack", "analyze", str(texts), "-o", str(out / f"P{p}"),
                              "--column", "text", "--size", "tokens", "--tokenizer", str(tok), "--profile",
                              "--overwrite", "--quiet"], TIMEOUT, p, pin_rayon=False)
            man = json.loads((out / f"P{p}" / "manifest.json").read_text())
            stage = man["provenance"]["profile"]["analyze"]["wall_s"]
            log(f"round {r + 1}: analyze --size tokens P={p}: stage {stage:.2f} s, command {wall:.2f} s "
                f"(load {load:.1f})")
            if p not in best or stage < best[p]["stage"]:
                best[p] = {"stage": stage, "wall": wall, "load": load,
                           "size_sum": man["stats"]["size_sum"], "samples": man["num_samples"]}
    shutil.rmtree(out, ignore_errors=True)
    base = best["base"]
    chars = sum(len(t) for t in _texts(texts))
    sec = Section(f"analyze --size tokens, {base['samples']} stdlib texts ({chars / 1e6:.1f}M characters), "
                  "BPE 8k, vs one encode_batch (default thread pool) in the same run",
                  ["P", "analyze stage", "whole command", "encode_batch", "throughput vs encode_batch (stage)",
                   "(command)", "load at run / baseline"])
    rows = []
    for p in RANKS:
        b = best[p]
        same = b["size_sum"] == base["size_sum"] and b["samples"] == base["samples"]
        sec.rows.append([str(p), secs(b["stage"]), secs(b["wall"]), secs(base["seconds"]),
                         f"{base['seconds'] / b['stage']:.2f}×", f"{base['seconds'] / b['wall']:.2f}×",
                         f"{b['load']:.1f} / {base['load']:.1f}"])
        rows.append(Row("scaling", "analyze --size tokens (stage) vs one encode_batch, stdlib source", p,
                        secs(b["stage"]), f"encode_batch: {secs(base['seconds'])}",
                        f"{base['seconds'] / b['stage']:.2f}× throughput", "≥ 1×", base["seconds"] / b["stage"] >= 1
                        and same, f"load {b['load']:.1f}; " + ("same token counts" if same
                                                               else "TOKEN COUNTS DIFFER FROM encode_batch")))
    return [sec], rows


def _texts(path: Path) -> list[str]:
    import pyarrow.dataset as ds

    return ds.dataset(str(path), format="parquet").to_table(columns=["text"])["text"].to_pylist()


def bench(ctx) -> list[Row]:
    """The suite's ``scaling`` benchmark: both tables into the report, the goal rows back."""
    compile_checkout()
    sort_secs, sort_rows = bench_sort(ctx.scale_name, ctx.log)
    tok_secs, tok_rows = bench_tokens(ctx.scale_name, ctx.log)
    ctx.sections.extend(sort_secs + tok_secs)
    return sort_rows + tok_rows


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print their tables."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_scaling", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SIZES), default="small")
    ap.add_argument("--only", choices=["sort", "tokens", "keep", "weak"], help="one part only")
    ap.add_argument("--texts", type=int, help="stdlib texts to tokenize (0: all; default: the scale's)")
    args = ap.parse_args(argv)
    log = script_log("bench_scaling", args.scale)

    compile_checkout()
    sections, rows = [], []
    if args.only in ("keep",):
        s, r = bench_keep(args.scale, log)
        sections, rows = sections + s, rows + r
    if args.only in ("weak",):
        s, r = bench_weak(args.scale, log)
        sections, rows = sections + s, rows + r
    if args.only in (None, "sort"):
        s, r = bench_sort(args.scale, log)
        sections, rows = sections + s, rows + r
    if args.only in (None, "tokens"):
        s, r = bench_tokens(args.scale, log, args.texts)
        sections, rows = sections + s, rows + r
    print_script_results(sections, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
