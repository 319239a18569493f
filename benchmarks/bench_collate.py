"""Fetch + collate in one process, from stored data: samples/s of the documented loops, old code against new.

    python benchmarks/bench_collate.py --rows 100000 --repeat 3 --code /path/to/old/checkout --code .

Builds (once, in ``--workdir``) a text dataset of word-level tokens, a word-level tokenizer
and a plan with ``sortpack run --size tokens --tokenizer tok.json --store text --store-tokens
--max-tokens 32768``, then times, per ``--code`` checkout (a repository root put first on
``PYTHONPATH``, each in its own process, interleaved over ``--repeat`` rounds):

- ``ids pad``: ``SourceDataset(plan)`` + ``pad_collate(key="input_ids")`` (stored token ids);
- ``ids varlen``: the same with ``varlen_collate(key="input_ids")``;
- ``text pad``: ``SourceDataset(plan, columns=["text"])`` + ``pad_collate(tokenize=utf8)``
  (stored text, UTF-8 bytes as tokens).

Each measure is ``dataset.__getitems__(micro_batch)`` then the collate, over the first
``--microbatches`` micro-batches of a shuffled epoch, in one process (no DataLoader). Prints
the median samples/s per loop and checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ("ids pad", "ids varlen", "text pad")


def utf8(row: dict) -> bytes:
    """Return the UTF-8 bytes of a row's text (the byte-level tokens)."""
    return row["text"].encode()


def build(workdir: Path, rows: int, seed: int = 0) -> Path:
    """Write the dataset, the tokenizer and the stored plan under ``workdir`` (kept between runs); return the plan."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, models, pre_tokenizers

    plan = workdir / f"plan-{rows}"
    if (plan / "manifest.json").is_file():
        return plan
    workdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(4000)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *vocab])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(workdir / "tok.json"))
    words = np.array(vocab)
    lengths = np.clip(rng.lognormal(5.0, 0.8, rows).astype(int), 1, 4000)
    flat = words[rng.integers(0, len(words), int(lengths.sum()))]
    cuts = np.cumsum(lengths)[:-1]
    texts = [" ".join(part) for part in np.split(flat, cuts)]
    data = workdir / f"data-{rows}.parquet"
    pq.write_table(pa.table({"text": texts}), data, row_group_size=10_000)
    subprocess.run([sys.executable, "-m", "sortpack", "run", str(data), "-o", str(plan), "--column", "text",
                    "--size", "tokens", "--tokenizer", str(workdir / "tok.json"), "--max-tokens", "32768",
                    "--store", "text", "--store-tokens", "--quiet"], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return plan


def measure(plan: str, microbatches: int) -> dict:
    """Return samples/s of each loop over the first ``microbatches`` micro-batches of a shuffled epoch."""
    from sortpack.torch import PackedBatchSampler, SourceDataset, pad_collate, varlen_collate

    mbs = list(PackedBatchSampler(plan, rank=0, world_size=1, order="shuffle", seed=0))[:microbatches]
    samples = sum(len(mb) for mb in mbs)
    text = SourceDataset(plan, columns=["text"])
    # bytes as tokens, not the token counts the plan holds: the collate's check against the plan
    # (tokenize= must return what a --size tokens plan counted) is turned off for this loop
    text.size_unit = None
    setups = {"ids pad": (SourceDataset(plan), pad_collate(key="input_ids")),
              "ids varlen": (SourceDataset(plan), varlen_collate(key="input_ids")),
              "text pad": (text, pad_collate(tokenize=utf8))}
    out = {}
    for name, (ds, collate) in setups.items():
        collate(ds.__getitems__(mbs[0]))  # shards mapped, pages touched once
        t0 = time.perf_counter()
        for mb in mbs:
            collate(ds.__getitems__(mb))
        out[name] = samples / (time.perf_counter() - t0)
    return out


def main() -> None:
    """Build the plan once, then time every loop per checkout in interleaved rounds and print the medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--microbatches", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/sortpack-bench-collate")
    ap.add_argument("--code", action="append", help="a checkout to time (repeatable; default: this one)")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.microbatches)))
        return
    plan = build(Path(args.workdir), args.rows)
    codes = args.code or [str(ROOT)]
    got: dict = {c: {name: [] for name in LOOPS} for c in codes}
    for _ in range(args.repeat):
        for code in codes:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(code), "OMP_NUM_THREADS": "1"}
            res = subprocess.run([sys.executable, __file__, "--measure", str(plan), "--microbatches",
                                  str(args.microbatches)], env=env, check=True, capture_output=True, text=True)
            for name, rate in json.loads(res.stdout.strip().splitlines()[-1]).items():
                got[code][name].append(rate)
    print(f"plan {plan}: {args.rows} rows, first {args.microbatches} micro-batches of a shuffled epoch, "
          f"median of {args.repeat}")
    print(f"{'checkout':<40} " + " ".join(f"{name:>14}" for name in LOOPS))
    for code in codes:
        print(f"{code:<40} " + " ".join(f"{statistics.median(got[code][n]):>12.0f}/s" for n in LOOPS))


if __name__ == "__main__":
    main()
