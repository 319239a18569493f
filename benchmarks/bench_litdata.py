"""Raw text to stored token ids: ``sortpack run --store-tokens`` at 2 ranks vs LitData's ``optimize`` with 2 workers.

    PYTHONPATH=$PWD python -m benchmarks.bench_litdata --scale full     # all stdlib texts, 3 rounds
    PYTHONPATH=$PWD python -m benchmarks --only litdata --scale small   # in the suite (CI): 1500 texts

The same Parquet texts as ``bench_fasttok`` (the standard library's source, one row per function
or class) and the same byte-level BPE ``tokenizer.json`` of 8k, whole processes, launched
alternately in each round, each keeping its fastest:

- sortpack: ``sortpack run TEXTS --column text --size tokens --tokenizer T --store-tokens
  --oversize split --rows 4096`` under ``mpiexec -n 2`` (read, tokenize, sort, pack, store the ids:
  a packed plan a trainer reads), as a user runs it (the fast exact path: texts through the
  compiled BPE, those holding an added token's text through tiktoken; the goal's run), with
  ``SORTPACK_FAST_TOKENIZER=tiktoken`` (tiktoken for every text) and with ``=0`` (Hugging Face
  ``tokenizers``, the path before); the plans' ``content_hash`` must be equal;
- LitData: ``optimize(fn=tokenize, inputs=<row groups>, num_workers=2, chunk_bytes="64MB",
  item_loader=TokensLoader())`` in one subprocess, ``fn`` reading one Parquet row group, encoding
  its texts with the same ``tokenizer.json`` (Hugging Face ``tokenizers``, ``encode_batch``) and
  yielding each text's ids (int32): LitData's token-stream form, which its loader cuts into blocks.

Figure: LitData's whole process over sortpack's (wall; the CPU time of all their processes
beside it), both with their token totals (which must be equal). Goal: at least 1.5x. Skipped with
one row where ``litdata`` (an optional peer, not a dependency) or ``tokenizers`` is not
importable. Every figure carries the 1-minute load average of its round.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
from pathlib import Path

from . import data
from .bench_fasttok import _encoder, encoder_used
from .bench_scaling import bpe_tokenizer, stdlib_texts
from .report import Row, Section, print_script_results, script_log, secs
from .runner import launch, missing_modules

TEXTS = {"small": 1500, "full": 0}  # rows of the stdlib dataset (0: all of them)
ROUNDS = {"small": 1, "full": 3}
RANKS = 2
ROW_LEN = 4096
GOAL = 1.5  # LitData's wall over sortpack's
TIMEOUT = 1800
ENCODERS = ("default", "tiktoken", "tokenizers")  # sortpack as a user runs it (the goal's), tiktoken alone, before

LITDATA_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import pyarrow.parquet as pq
from litdata import optimize
from litdata.streaming.item_loader import TokensLoader
from tokenizers import Tokenizer

args = json.loads(sys.argv[1])
_tok = []


def tokenize(item):
    path, group = item
    if not _tok:
        _tok.append(Tokenizer.from_file(args["tokenizer"]))
    texts = pq.ParquetFile(path).read_row_group(group, columns=["text"]).column("text").to_pylist()
    for enc in _tok[0].encode_batch(texts, add_special_tokens=False):
        yield np.asarray(enc.ids, dtype=np.int32)


if __name__ == "__main__":
    inputs = [(p, g) for p in args["files"] for g in range(pq.ParquetFile(p).num_row_groups)]
    optimize(fn=tokenize, inputs=inputs, output_dir=args["out"], num_workers=args["workers"], chunk_bytes="64MB",
             item_loader=TokensLoader(), mode="overwrite")
    with open(args["out"] + "/index.json") as f:
        index = json.load(f)
    tokens = sum(c["dim"] or 0 for c in index["chunks"])
    print("BENCH_JSON " + json.dumps({"seconds": time.perf_counter() - t0, "tokens": tokens,
                                      "chunks": len(index["chunks"])}))
"""


def _load1() -> float:
    return os.getloadavg()[0]


def _children_cpu() -> float:
    """Return the user+sys seconds of every waited-for child process so far (ranks and workers included)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def litdata_optimize(files: list[str], tokenizer: str, out: Path, timeout: float) -> tuple[float, dict]:
    """Return (wall seconds, the script's figures) of LitData's ``optimize`` of ``files`` in a subprocess."""
    # a script file, not ``-c``: LitData's workers are spawned and import ``fn`` from the main module
    script = out.parent / "litdata_optimize.py"
    script.write_text(LITDATA_SCRIPT)
    args = {"files": files, "tokenizer": tokenizer, "out": str(out), "workers": RANKS}
    wall, stdout = launch([sys.executable, str(script), json.dumps(args)], timeout, pin_rayon=False)
    for line in reversed(stdout.splitlines()):
        if line.startswith("BENCH_JSON "):
            res = json.loads(line[len("BENCH_JSON "):])
            if not res["tokens"]:
                # a worker that fails leaves optimize finishing with an empty index
                raise RuntimeError("the LitData run wrote no tokens")
            return wall, res
    raise RuntimeError("the LitData run printed no result")


def measure(scale: str, log, texts_n: int | None = None) -> tuple[list[Section], list[Row]]:
    """Alternate sortpack's run and LitData's optimize; return the table and the goal row."""
    missing = missing_modules("litdata", "tokenizers")
    if missing:
        return [], [Row("litdata", "raw text to stored token ids vs LitData optimize", RANKS, "skipped",
                        note=f"{', '.join(missing)} not installed")]
    import pyarrow.parquet as pq

    texts = stdlib_texts(TEXTS[scale] if texts_n is None else texts_n)
    tok = bpe_tokenizer(texts)
    files = sorted(str(p) for p in texts.glob("*.parquet"))
    n_texts = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    out = data.work_dir("litdata")
    best: dict = {}
    for r in range(ROUNDS[scale]):
        for name in ENCODERS:
            load, target, cpu = _load1(), out / f"sortpack-{name}", _children_cpu()
            with _encoder(name):
                wall, _ = launch([sys.executable, "-m", "sortpack", "run", *files, "-o", str(target), "--column",
                                  "text", "--size", "tokens", "--tokenizer", str(tok), "--store-tokens", "--oversize",
                                  "split", "--rows", str(ROW_LEN), "--overwrite", "--quiet"], TIMEOUT, RANKS,
                                 pin_rayon=False)
            cpu = _children_cpu() - cpu
            man = json.loads((target / "manifest.json").read_text())
            rec = man["provenance"].get("tokenizers", {}).get(tok.name, {})
            used = encoder_used(rec)
            log(f"round {r + 1}: sortpack run P={RANKS} ({used}) {wall:.2f} s, CPU {cpu:.2f} s (load {load:.1f})")
            if name not in best or wall < best[name]["wall"]:
                best[name] = {"wall": wall, "cpu": cpu, "load": load, "tokens": man["stats"]["tokens"],
                              "used": used, "hash": man["content_hash"]}
        load, cpu = _load1(), _children_cpu()
        wall, res = litdata_optimize(files, str(tok), out / "litdata", TIMEOUT)
        cpu = _children_cpu() - cpu
        log(f"round {r + 1}: litdata optimize, {RANKS} workers {wall:.2f} s, CPU {cpu:.2f} s (in-process "
            f"{res['seconds']:.2f} s, load {load:.1f})")
        if "litdata" not in best or wall < best["litdata"]["wall"]:
            best["litdata"] = {"wall": wall, "cpu": cpu, "load": load, "tokens": res["tokens"]}
    shutil.rmtree(out, ignore_errors=True)
    return _tables(best, n_texts)


def _tables(best: dict, n_texts: int) -> tuple[list[Section], list[Row]]:
    ld = best["litdata"]
    same_hash = len({best[name]["hash"] for name in ENCODERS}) == 1
    sec = Section(f"raw text to stored token ids, {n_texts} stdlib texts, BPE 8k, {RANKS} ranks / workers, "
                  "alternated in one run",
                  ["system", "whole process", "CPU (user+sys)", "tokens", "LitData / it (wall)", "(CPU)",
                   "load at run"])
    rows = []
    for name in ENCODERS:
        sp = best[name]
        ratio, same = ld["wall"] / sp["wall"], sp["tokens"] == ld["tokens"]
        sec.rows.append([f"sortpack run --store-tokens --rows {ROW_LEN} ({sp['used']})", secs(sp["wall"]),
                         secs(sp["cpu"]), str(sp["tokens"]), f"{ratio:.2f}×", f"{ld['cpu'] / sp['cpu']:.2f}×",
                         f"{sp['load']:.1f}"])
        goal = name == ENCODERS[0]
        note = (f"CPU {secs(sp['cpu'])} vs {secs(ld['cpu'])} ({ld['cpu'] / sp['cpu']:.2f}×); "
                f"load {sp['load']:.1f} / {ld['load']:.1f}; " + ("same token totals" if same else "TOKEN TOTALS DIFFER")
                + ("; content_hash equal to the other encoders'" if same_hash else "; CONTENT HASH DIFFERS"))
        what = f"raw text to a stored packed plan ({sp['used']}) vs LitData optimize ({n_texts} texts)"
        rows.append(Row("litdata", what, RANKS, secs(sp["wall"]), f"LitData optimize: {secs(ld['wall'])}",
                        f"{ratio:.2f}× faster", f"≥ {GOAL:g}×" if goal else "",
                        (ratio >= GOAL and same and same_hash) if goal else None, note))
    sec.rows.append(["LitData optimize (TokensLoader)", secs(ld["wall"]), secs(ld["cpu"]), str(ld["tokens"]), "", "",
                     f"{ld['load']:.1f}"])
    return [sec], rows


def bench(ctx) -> list[Row]:
    """The suite's ``litdata`` benchmark: its table into the report, the goal row back."""
    sections, rows = measure(ctx.scale_name, ctx.log)
    ctx.sections.extend(sections)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_litdata", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(TEXTS), default="small")
    ap.add_argument("--texts", type=int, help="stdlib texts to tokenize (0: all; default: the scale's)")
    args = ap.parse_args(argv)
    log = script_log("bench_litdata", args.scale)

    sections, rows = measure(args.scale, log, args.texts)
    print_script_results(sections, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
