"""Real vocabularies on real mixed-language text: sortpack's tokenizer path against ``encode_batch_fast`` and tiktoken.

    PYTHONPATH=$PWD python -m benchmarks.bench_real_tokens --scale full   # every document, three vocabularies
    PYTHONPATH=$PWD python -m benchmarks --only tokens --scale small       # in the suite (CI): 300 documents

The vocabularies are openai-whisper's rank files written as tokenizer.json files (``real_vocab.py``:
GPT-2's own, and the multilingual one as Llama 3- and Qwen 2-style files with ``ignore_merges``) and
Mistral 7B's SentencePiece models from mistral-common written as the Hugging Face converter writes
them (byte fallback, no pre-tokenizer: tiktoken cannot run them, so their rows have no tiktoken run);
the text is what this machine holds in many languages (gettext catalogs' translations, the standard
library's files; ``real_vocab.mixed_texts``), a quarter or more of it beyond ASCII, in Parquet.
Per vocabulary, launched alternately in each round, each keeping its fastest:

- the baseline: one ``Tokenizer.encode_batch_fast`` of every text, already in memory, in one process
  with the library's default pool (every core);
- tiktoken alone: ``Encoding.encode_ordinary_batch`` of every text with a thread per core, in one
  process, the Encoding of sortpack's exact conversion (the same ids);
- ``sortpack analyze --size tokens`` at P=1 and P=2 as a user runs it (every text through the compiled
  BPE, those holding an added token's text through tiktoken), and at P=2 with
  ``SORTPACK_FAST_TOKENIZER=tiktoken`` (tiktoken for every text);
- LitData's ``optimize`` of the texts with the same file, 2 workers (``bench_litdata``), where
  ``litdata`` is installed.

The figure is the analyze stage's time (``provenance.profile``), its ratio the baseline's time over
it; the whole command beside it. Checked once per vocabulary, untimed: sortpack's ids (its column
path), tiktoken's and ``encode_batch_fast``'s are equal on every text, and every run's token total
is the baseline's. A second table times single pre-tokenizer pieces of 50k and 1M bytes (runs of one
character, digits, base64, minified code) through the compiled BPE and through tiktoken, in one
process. Goal: P=2 at least 4x the baseline. Skipped, with a row saying why, where ``tokenizers``,
``tiktoken`` or openai-whisper (``pip install --no-deps openai-whisper``) is missing; a Mistral row
likewise where mistral-common's model files are (``real_vocab.mistral_models``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from . import data
from .bench_fasttok import _encoder, encoder_used
from .real_vocab import SP_VARIANTS, mixed_texts, whisper_assets, write_sentencepiece, write_variant
from .report import Row, Section, print_script_results, script_log, secs
from .runner import BenchError, launch, missing_modules, timed_worker
from .workers import PREFIX

DOCS = {"small": 300, "full": 0}  # documents of the corpus (0: every one this machine has)
VOCABS = {"small": ("multilingual-llama3", "mistral-v3"),
          "full": ("gpt2", "multilingual-llama3", "multilingual-qwen2", "mistral-v1", "mistral-v3")}
ROUNDS = {"small": 1, "full": 3}
RUN_BYTES = {"small": (50_000,), "full": (50_000, 1_000_000)}
GOAL = 4.0  # P=2 over one encode_batch_fast, by throughput
TIMEOUT = 1800
RUNS = ("sortpack", 1), ("sortpack", 2), ("tiktoken", 2)  # (encoder, ranks) of the analyze runs


def corpus(docs: int) -> tuple[Path, dict]:
    """Return a directory of Parquet mixed-language documents (two files, row groups of 64) and its figures."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = data.work_dir(f"mixed-{docs or 'all'}")
    stats = folder.with_suffix(".stats")  # beside the folder: analyze reads every file in it
    if not stats.is_file():
        texts = mixed_texts(docs)
        half = len(texts) // 2
        for k, part in enumerate((texts[:half], texts[half:])):
            pq.write_table(pa.table({"text": part}), folder / f"part-{k}.parquet", row_group_size=64)
        beyond = sum(any(ord(c) > 127 for c in t) for t in texts)
        stats.write_text(json.dumps({"documents": len(texts), "characters": sum(map(len, texts)),
                                     "bytes": sum(len(t.encode()) for t in texts), "beyond_ascii": beyond}))
    return folder, json.loads(stats.read_text())


# --- the in-process parts (python -m benchmarks.bench_real_tokens --worker KIND ARGS) -----------------------------
def _texts(path: str) -> list[str]:
    import pyarrow.dataset as ds

    return ds.dataset(path, format="parquet").to_table(columns=["text"])["text"].to_pylist()


def _tiktoken_encoding(tokenizer: str):
    """Return tiktoken's Encoding of sortpack's exact conversion of ``tokenizer`` (the same ids as the file's) and the
    conversion."""
    from tokenizers import Tokenizer

    from sortpack.inputs.fast_tokens import _converted

    got = _converted(tokenizer, lambda: Tokenizer.from_file(tokenizer))
    if isinstance(got, str):
        raise BenchError(f"{tokenizer}: no exact conversion ({got})")
    return got.encoding, got.conv


def work_tiktoken(a: dict) -> dict:
    """Time tiktoken's own batch encode of every text, a thread per core (the best of ``repeats``); its token total
    counts the tokens the post-processor adds, as the others' do."""
    (enc, conv), texts = _tiktoken_encoding(a["tokenizer"]), _texts(a["path"])
    best, total = float("inf"), 0
    for _ in range(a["repeats"]):
        t0 = time.perf_counter()
        got = enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)
        best, total = min(best, time.perf_counter() - t0), sum(map(len, got))
    return {"seconds": best, "size_sum": total + len(texts) * (len(conv.prefix) + len(conv.suffix)),
            "samples": len(texts)}


def work_ids(a: dict) -> dict:
    """Return whether sortpack's ids (its column path), tiktoken's and encode_batch_fast's are equal on each text."""
    import pyarrow.dataset as ds
    from tokenizers import Tokenizer

    from sortpack.inputs.fast_tokens import token_ids
    from sortpack.inputs.specs import load_tokenizer

    col = ds.dataset(a["path"], format="parquet").to_table(columns=["text"])["text"]
    texts = col.to_pylist()
    hf = [e.ids for e in Tokenizer.from_file(a["tokenizer"]).encode_batch_fast(texts, add_special_tokens=False)]
    enc = load_tokenizer(a["tokenizer"])
    ours = token_ids(enc, col, special_tokens=False)[0].to_pylist()
    tiktokens = _tiktoken_encoding(a["tokenizer"])[0].encode_batch(texts, allowed_special="all") \
        if a.get("tiktoken", True) else hf
    return {"equal": ours == hf and tiktokens == hf, "tokens": sum(map(len, hf)), "record": enc.record()}


def long_pieces(n: int) -> dict[str, str]:
    """Return single pre-tokenizer pieces of ``n`` bytes that real text has: rules, digits, base64, minified code."""
    import base64
    import random

    rng = random.Random(0)
    blob = base64.b64encode(rng.randbytes(n)).decode()
    letters = "".join(c for c in blob if c.isalpha())
    return {"'=' rule": "=" * n, "'-' rule": "-" * n, "digits (GPT-2: one piece)": "7" * n,
            "base64 letters": (letters * (n // len(letters) + 1))[:n], "minified punctuation": ("}]);" * n)[:n]}


def work_runs(a: dict) -> dict:
    """Time each long piece through the compiled BPE and through tiktoken (best of 3); their ids must be equal."""
    import numpy as np

    from sortpack.kernels import bpe

    enc, conv = _tiktoken_encoding(a["tokenizer"])
    tab = bpe.table(conv.ranks)
    out = {}
    for n in a["sizes"]:
        for name, text in long_pieces(n).items():
            raw = np.frombuffer(text.encode(), np.uint8)
            offsets = np.array([0, len(raw)])
            ours, ids = _best_of_3(bpe.encode, tab, conv.style, (raw, offsets))
            theirs, want = _best_of_3(enc.encode_ordinary, text)
            out[f"{name}, {n:,} bytes"] = {"ours": ours, "tiktoken": theirs, "same": ids[0].tolist() == want}
    return out


def _best_of_3(fn, *args) -> tuple[float, object]:
    """Return the best of three timings of ``fn(*args)`` and its result."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        got = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, got


WORKERS = {"tiktoken": work_tiktoken, "ids": work_ids, "runs": work_runs}


def _work(kind: str, args: dict, timeout: float = TIMEOUT) -> dict:
    """Return the result of an in-process part run in its own process."""
    _, out = launch([sys.executable, "-m", "benchmarks.bench_real_tokens", "--worker", kind, json.dumps(args)],
                    timeout, pin_rayon=False)
    for line in reversed(out.splitlines()):
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
    raise BenchError(f"bench_real_tokens worker {kind} printed no result line")


# --- the driver ---------------------------------------------------------------------------------------------------
def _analyze(texts: Path, tok: Path, name: str, ranks: int, out: Path) -> dict:
    """Run ``sortpack analyze --size tokens`` as a user would; return its stage, command, encoder and totals."""
    target = out / f"{name}-P{ranks}"
    with _encoder("default" if name == "sortpack" else name):
        wall, _ = launch([sys.executable, "-m", "sortpack", "analyze", str(texts), "-o", str(target), "--column",
                          "text", "--size", "tokens", "--tokenizer", str(tok), "--profile", "--overwrite",
                          "--quiet"], TIMEOUT, ranks, pin_rayon=False)
    man = json.loads((target / "manifest.json").read_text())
    rec = man["provenance"].get("tokenizers", {}).get(tok.name, {})
    return {"stage": man["provenance"]["profile"]["analyze"]["wall_s"], "wall": wall, "used": encoder_used(rec),
            "size_sum": man["stats"]["size_sum"], "hash": man["content_hash"]}


def _keep(best: dict, key, got: dict, by: str) -> None:
    if key not in best or got[by] < best[key][by]:
        best[key] = got


def _litdata(texts: Path, tok: Path, out: Path) -> dict | None:
    """Return LitData's optimize of the texts with ``tok`` (wall, tokens), None where litdata is not installed."""
    if missing_modules("litdata"):
        return None
    from .bench_litdata import litdata_optimize

    wall, res = litdata_optimize(sorted(str(p) for p in texts.glob("*.parquet")), str(tok), out / "litdata", TIMEOUT)
    return {"wall": wall, "tokens": res["tokens"]}


def _runs_of(name: str) -> tuple[tuple[str, int], ...]:
    """Return the analyze runs of a vocabulary: no tiktoken run for a SentencePiece one (tiktoken cannot run it)."""
    return RUNS[:2] if name in SP_VARIANTS else RUNS


def measure_vocab(name: str, texts: Path, scale: str, log) -> dict:
    """Alternate the baseline, tiktoken alone, the analyze runs and LitData for one vocabulary; the best of each."""
    out = data.work_dir("real-tokens")
    sp = name in SP_VARIANTS
    tok = (write_sentencepiece if sp else write_variant)(name, data.work_dir("real-vocabularies"))
    if tok is None:
        raise BenchError("mistral-common is not installed (its model files are not found)" if sp else
                         "openai-whisper is not installed")
    best: dict = {"ids": _work("ids", {"path": str(texts), "tokenizer": str(tok), "tiktoken": not sp})}
    log(f"{name}: ids equal {best['ids']['equal']} ({best['ids']['tokens']} tokens, {best['ids']['record']})")
    for r in range(ROUNDS[scale]):
        load = os.getloadavg()[0]
        _, base = timed_worker("encode", {"path": str(texts), "column": "text", "tokenizer": str(tok), "repeats": 1,
                                          "fast": True}, TIMEOUT, None, False)
        _keep(best, "base", {**base, "load": load}, "seconds")
        if not sp:
            _keep(best, "tiktoken alone", {**_work("tiktoken", {"path": str(texts), "tokenizer": str(tok),
                                                                "repeats": 1}), "load": load}, "seconds")
        for enc, p in _runs_of(name):
            got = {**_analyze(texts, tok, enc, p, out), "load": os.getloadavg()[0]}
            log(f"round {r + 1}: {name} analyze P={p} ({got['used']}): stage {got['stage']:.2f} s, command "
                f"{got['wall']:.2f} s (load {got['load']:.1f})")
            _keep(best, (enc, p), got, "stage")
        lit = _litdata(texts, tok, out)
        if lit is not None:
            _keep(best, "litdata", {**lit, "load": os.getloadavg()[0]}, "wall")
        alone = f", tiktoken alone {best['tiktoken alone']['seconds']:.2f} s" if not sp else ""
        log(f"round {r + 1}: {name} encode_batch_fast {base['seconds']:.2f} s{alone} (load {load:.1f})")
    shutil.rmtree(out, ignore_errors=True)
    return best


def _vocab_rows(name: str, best: dict, sec: Section) -> list[Row]:
    base, ids = best["base"], best["ids"]
    runs = _runs_of(name)
    same_hash = len({best[k]["hash"] for k in runs if k[1] == 2}) == 1
    rows = []
    for key in runs:
        b = best[key]
        ratio, same = base["seconds"] / b["stage"], b["size_sum"] == base["size_sum"]
        sec.rows.append([name, f"analyze P={key[1]}: {b['used']}", secs(b["stage"]), secs(b["wall"]),
                         f"{ratio:.2f}×", "yes" if same and ids["equal"] else "NO", f"{b['load']:.1f}"])
        goal = key == ("sortpack", 2)
        note = f"load {b['load']:.1f}; " + ("ids equal" if ids["equal"] else "IDS DIFFER") + \
            ("" if same else "; TOKEN TOTALS DIFFER") + ("" if same_hash else "; CONTENT HASH DIFFERS")
        rows.append(Row("tokens", f"{name}: analyze --size tokens (stage), {b['used']}, vs one encode_batch_fast",
                        key[1], secs(b["stage"]), f"encode_batch_fast: {secs(base['seconds'])}",
                        f"{ratio:.2f}× throughput", f"≥ {GOAL:g}×" if goal else "",
                        (ratio >= GOAL and same and ids["equal"] and same_hash) if goal else None, note))
    tk = best.get("tiktoken alone")
    if tk is not None:
        sec.rows.append([name, "tiktoken alone (encode_ordinary_batch, a thread per core)", secs(tk["seconds"]), "",
                         f"{base['seconds'] / tk['seconds']:.2f}×",
                         "yes" if tk["size_sum"] == base["size_sum"] else "NO", f"{tk['load']:.1f}"])
    sec.rows.append([name, "encode_batch_fast (default pool), the baseline", secs(base["seconds"]), "", "1.00×", "",
                     f"{base['load']:.1f}"])
    if "litdata" in best:
        lit = best["litdata"]
        sec.rows.append([name, "LitData optimize, 2 workers (whole process)", "", secs(lit["wall"]), "",
                         "tokens " + ("equal" if lit["tokens"] == base["size_sum"] else "DIFFER"),
                         f"{lit['load']:.1f}"])
    return rows


def _runs_section(tok: Path, scale: str) -> tuple[Section, list[Row]]:
    got = _work("runs", {"tokenizer": str(tok), "sizes": list(RUN_BYTES[scale])})
    sec = Section(f"one long pre-tokenizer piece, the compiled BPE vs tiktoken in one process ({tok.stem}; load "
                  f"{os.getloadavg()[0]:.1f})", ["piece", "compiled BPE", "tiktoken", "tiktoken / it", "ids equal"])
    worst = max(v["ours"] / v["tiktoken"] for v in got.values())
    for what, v in got.items():
        sec.rows.append([what, secs(v["ours"]), secs(v["tiktoken"]), f"{v['tiktoken'] / v['ours']:.2f}×",
                         "yes" if v["same"] else "NO"])
    row = Row("tokens", "long pieces: the compiled BPE's time over tiktoken's (the worst piece)", None,
              f"{worst:.2f}×", target="≤ 2×", met=worst <= 2 and all(v["same"] for v in got.values()),
              note=f"{len(got)} pieces of {', '.join(f'{n:,}' for n in RUN_BYTES[scale])} bytes")
    return sec, [row]


def measure(scale: str, log, docs: int | None = None, vocabs: tuple[str, ...] | None = None
            ) -> tuple[list[Section], list[Row]]:
    """Run every vocabulary's alternated rounds and the long pieces; return the tables and the goal rows."""
    missing = missing_modules("tokenizers", "tiktoken")
    if missing or whisper_assets() is None:
        why = f"{', '.join(missing)} not installed" if missing else \
            "openai-whisper is not installed (pip install --no-deps openai-whisper)"
        return [], [Row("tokens", "real vocabularies on mixed-language text", None, "skipped", note=why)]
    texts, stats = corpus(DOCS[scale] if docs is None else docs)
    log(f"corpus: {stats}")
    sec = Section(f"analyze --size tokens on {stats['documents']} real documents ({stats['characters']:,} "
                  f"characters, {stats['beyond_ascii']} beyond ASCII), real vocabularies, vs one encode_batch_fast "
                  f"({os.cpu_count()} threads) in the same run",
                  ["vocabulary", "path", "analyze stage", "whole command", "throughput vs baseline",
                   "ids / tokens equal", "load"])
    rows = []
    for name in vocabs or VOCABS[scale]:
        try:
            rows += _vocab_rows(name, measure_vocab(name, texts, scale, log), sec)
        except BenchError as exc:  # a vocabulary whose package is missing: a row saying so, the others measured
            if "is not installed" not in str(exc):
                raise
            rows.append(Row("tokens", f"{name}: analyze --size tokens", None, "skipped", note=str(exc)))
    runs, run_rows = _runs_section(write_variant("gpt2", data.work_dir("real-vocabularies")), scale)
    return [sec, runs], rows + run_rows


def bench(ctx) -> list[Row]:
    """The suite's real-vocabulary tokens benchmark: its tables into the report, the goal rows back."""
    sections, rows = measure(ctx.scale_name, ctx.log)
    ctx.sections.extend(sections)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--worker``, one in-process part) and print its tables."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_real_tokens", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(DOCS), default="small")
    ap.add_argument("--docs", type=int, help="documents of the corpus (0: all; default: the scale's)")
    ap.add_argument("--vocabs", help="the vocabularies, comma-separated (default: the scale's; names from "
                    "real_vocab.VARIANTS and SP_VARIANTS)")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "ARGS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(PREFIX + json.dumps(WORKERS[args.worker[0]](json.loads(args.worker[1]))), flush=True)
        return 0
    log = script_log("bench_real_tokens", args.scale)
    sections, rows = measure(args.scale, log, args.docs, tuple(args.vocabs.split(",")) if args.vocabs else None)
    print_script_results(sections, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
