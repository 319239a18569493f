"""The stored-token loop's fixed cost per micro-batch, against a bare numpy slice-and-pad loop.

    PYTHONPATH=$PWD python benchmarks/bench_tokens_loop.py --scale small        # the suite's `tokens_loop`
    PYTHONPATH=$PWD python benchmarks/bench_tokens_loop.py --scale full --code /work/main --code .

Real text tokens: the Python standard library's sources, tokenized by a byte-level BPE
tokenizer trained on them (``tokenizers``, in memory, no download), become two plans with
``sortpack run --size tokens --tokenizer tok.json --store-tokens --oversize truncate``:

- ``long``: whole source files, ``--max-tokens 4096``: micro-batches of a few long files;
- ``short``: the files cut before each top-level statement after a blank line, ``--max-tokens 16384``: about 60
  samples per micro-batch.

Over every micro-batch of a shuffled epoch (seed 1), one process per ``--code`` checkout
(a repository root first on ``PYTHONPATH``, rounds interleaved, best of the rounds) times:

- ``numpy``: the baseline, a bare loop that slices each sample's ids out of one flat array
  of all stored tokens and pads them into a ``(batch_size, padded_size)`` int64 array
  (offsets and shapes precomputed; no labels, no masks, no sampler);
- ``inline pad`` / ``inline varlen``: sortpack's fetch + collate in the loop's thread:
  ``collate(SourceDataset(plan).__getitems__(mb))`` for each ``mb`` of the sampler;
- ``PlanLoader pad`` / ``PlanLoader varlen``: the documented loop,
  ``PlanLoader(SourceDataset(plan), sampler, pad_collate(key="input_ids"))``;
- ``datasets``: Hugging Face ``datasets`` over the same stored tokens (one Parquet file in
  plan order), ``with_format("torch")`` and ``DataLoader(batch_sampler=the same
  micro-batches, collate_fn=pad_sequence)``, at ``num_workers=0`` and ``2``: the faster;
- ``megatron``: Megatron-core's read path where ``megatron.core`` is importable (else the
  row says why it is skipped): the same documents in an ``IndexedDataset`` (.bin/.idx),
  ``GPTDataset`` sequences of the micro-batch's token budget through a ``BlendedDataset``
  of that one dataset, ``dataset[i]`` per sequence.

Figures: µs per micro-batch (a sequence for Megatron), real tokens/s, and each loop's
ratio to the numpy loop (its speed over the numpy loop's) measured in the same process.
Then, beside a simulated 1 ms training step that lets go of the GIL (a sleep, as a CUDA wait),
the µs per micro-batch the loop waits for its batch: inline (all of fetch + collate) and
with ``PlanLoader`` (what its thread did not prepare during the step).
Goal: PlanLoader at >= 0.1x the numpy loop on ``long``, >= 0.5x on ``short``, by
wall time (what a training loop waits; CPU time beside it), quiet and under load, and <= 100 µs
of fixed cost per micro-batch. Every loop runs its epoch twice in a row per round (the second
run finds the tokens in cache whatever ran before) and is timed in blocks of 32 micro-batches
(its iterator drained by ``islice``, no Python per item); an epoch's time is the sum of each
block's best over the runs: a block of PlanLoader's (about a millisecond) fits between two preemptions on a
busy machine as one of the numpy loop's does, where PlanLoader's whole epoch (tens of
milliseconds) cannot, so whole-epoch times would flatter the numpy loop by the load factor. Each
table line gives the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "_work" / "tokens_loop"
SCALES = {"small": (400, 1), "full": (2000, 5)}  # source files, rounds
PLANS = {"long": 4096, "short": 16384}  # plan -> --max-tokens
LOOPS = ("numpy", "inline pad", "inline varlen", "PlanLoader pad", "PlanLoader varlen", "datasets", "megatron")


def _sources(files: int) -> list[str]:
    """Return the texts of the first ``files`` standard-library sources (sorted by path, tests left out)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in lib.rglob("*.py")
                   if not {"site-packages", "test", "tests", "idle_test"} & set(p.relative_to(lib).parts))
    texts = []
    for p in paths[:files]:
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def _blocks(texts: list[str]) -> list[str]:
    """Return the texts cut before each top-level statement that follows a blank line, empty ones left out."""
    out = []
    for t in texts:
        out.extend(b for b in re.split(r"\n\s*\n(?=\S)", t) if b.strip())
    return out


def build(scale: str) -> dict:
    """Write the texts, the tokenizer and both plans under benchmarks/_work/tokens_loop (once per scale)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files, _ = SCALES[scale]
    work = WORK / scale
    plans = {name: work / f"plan-{name}" for name in PLANS}
    if all((p / "manifest.json").is_file() for p in plans.values()):
        return {k: str(v) for k, v in plans.items()}
    work.mkdir(parents=True, exist_ok=True)
    texts = _sources(files)
    tok_path = work / "tok.json"
    if not tok_path.is_file():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, show_progress=False,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.save(str(tok_path))
    for name, rows in (("long", texts), ("short", _blocks(texts))):
        data = work / f"{name}.parquet"
        pq.write_table(pa.table({"text": rows}), data, row_group_size=5000)
        subprocess.run([sys.executable, "-m", "sortpack", "run", str(data), "-o", str(plans[name]),
                        "--column", "text", "--size", "tokens", "--tokenizer", str(tok_path),
                        "--max-tokens", str(PLANS[name]), "--oversize", "truncate", "--store-tokens",
                        "--quiet", "--overwrite"],
                       check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return {k: str(v) for k, v in plans.items()}


# --- the loops, in the measuring process ------------------------------------------------------
def _stored_tokens(plan: str) -> tuple[np.ndarray, np.ndarray]:
    """Return (values int32, offsets int64) of every stored row's input_ids, in plan order."""
    import pyarrow as pa

    from sortpack.reader import PackedIndex

    stored = PackedIndex(plan).stored
    col = stored.rows(0, stored.num_rows).column("input_ids")
    arr = pa.concat_arrays(col.chunks) if isinstance(col, pa.ChunkedArray) else col
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy()[offsets[0]:offsets[-1]]
    return values, offsets - offsets[0]


def _megatron_files(plan: str, values: np.ndarray, offsets: np.ndarray) -> str:
    """Write the stored documents as a Megatron IndexedDataset (prefix.bin/.idx) beside the plan; return the prefix."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = os.path.join(plan, "..", Path(plan).name + "-megatron")
    if not os.path.isfile(prefix + ".idx"):
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
        import torch

        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            builder.add_document(torch.from_numpy(values[a:b].copy()), [b - a])
        builder.finalize(prefix + ".idx")
    return prefix


def _megatron(plan: str, budget: int, values: np.ndarray, offsets: np.ndarray, sequences: int):
    """Return a function that reads ``sequences`` GPTDataset sequences of ``budget`` tokens through a BlendedDataset."""
    import warnings

    warnings.filterwarnings("ignore")
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prefix = _megatron_files(plan, values, offsets)
    import tempfile

    import torch.distributed as dist

    if not dist.is_initialized():  # Megatron's builders ask rank 0 to write the index caches
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/pg", rank=0, world_size=1)

    class _Tok:  # what GPTDataset asks of a tokenizer: the ids it puts in padding and the end of a document
        eod, pad = 0, 1
        vocab_size = 8000
        unique_identifiers = {"class": "bench_tokens_loop", "eod": 0, "pad": 1}

    config = GPTDatasetConfig(random_seed=1, sequence_length=budget, blend=([prefix], [1.0]), split="100,0,0",
                              reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                              tokenizer=_Tok(), path_to_cache=os.path.join(plan, "..", "megatron-cache"),
                              mid_level_dataset_surplus=0.005)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [sequences, 0, 0], lambda: True, config).build()

    def loop() -> list:
        return _iterated((train[i] for i in range(sequences)), sequences)

    return loop


BLOCK = 32  # micro-batches per timed block: about a millisecond of PlanLoader's (a preemption-free stretch)


def _timed_blocks(blocks) -> list[tuple[float, float]]:
    """Return (wall, CPU) seconds of each call of ``blocks`` (callables, run one after another)."""
    out = []
    clock, cpu = time.perf_counter, time.process_time
    for block in blocks:
        c0, t0 = cpu(), clock()
        block()
        out.append((clock() - t0, cpu() - c0))
    return out


def _iterated(it, n: int) -> list[tuple[float, float]]:
    """Return (wall, CPU) seconds of each ``BLOCK`` items of iterator ``it`` (``n`` items), then exhaust it untimed."""
    from collections import deque
    from itertools import islice

    def block(k: int):
        return lambda: deque(islice(it, k), maxlen=0)  # no Python per item: each batch dropped as it comes

    got = _timed_blocks(block(min(BLOCK, n - k)) for k in range(0, n, BLOCK))
    deque(it, maxlen=0)  # the iterator's end (a loader's clean-up) outside the timing
    return got


def measure(plan: str, budget: int, rounds: int) -> dict:
    """Return, per loop, the best seconds over ``rounds`` interleaved rounds and the counts to turn them into rates."""
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from torch.utils.data import DataLoader

    from sortpack.reader import PackedIndex
    from sortpack.torch import PackedBatchSampler, PlanLoader, SourceDataset, pad_collate, varlen_collate

    torch.set_num_threads(1)
    order = dict(rank=0, world_size=1, order="shuffle", seed=1)
    index = PackedIndex(plan)
    values, offsets = _stored_tokens(plan)
    schedule = PackedBatchSampler(plan, **order).schedule().reshape(-1)
    row_start = index.stored.row_start
    lo, hi = row_start[schedule], row_start[schedule + 1]
    shapes = [index.shape(int(m)) for m in schedule]
    # the numpy loop's plain inputs: per micro-batch (bs, ps, [(start, stop) of each sample])
    plain = [(bs, ps, list(zip(offsets[a:b].tolist(), np.minimum(offsets[a + 1:b + 1], offsets[a:b] + ps).tolist())))
             for (bs, ps), a, b in zip(shapes, lo.tolist(), hi.tolist())]
    tokens = int(sum(e - s for _, _, spans in plain for s, e in spans))
    n = len(schedule)

    def numpy_block(block: list) -> None:
        for bs, ps, spans in block:
            out = np.zeros((bs, ps), dtype=np.int64)
            for j, (s, e) in enumerate(spans):
                out[j, :e - s] = values[s:e]

    numpy_blocks = [plain[k:k + BLOCK] for k in range(0, n, BLOCK)]

    def numpy_loop() -> list:
        return _timed_blocks((lambda b=b: numpy_block(b)) for b in numpy_blocks)

    # dataset, sampler and loader are built once, as a training job does: the loops time the epoch alone
    def inline(collate):
        ds, sampler = SourceDataset(plan), PackedBatchSampler(plan, **order)

        def loop() -> list:
            sampler.set_epoch(0)
            return _iterated((collate(ds.__getitems__(mb)) for mb in sampler), n)
        return loop

    def loader(collate):
        plan_loader = PlanLoader(SourceDataset(plan), PackedBatchSampler(plan, **order), collate)

        def loop() -> list:
            plan_loader.set_epoch(0)
            return _iterated(iter(plan_loader), n)
        return loop

    loops = {"numpy": numpy_loop,
             "inline pad": inline(pad_collate(key="input_ids")),
             "inline varlen": inline(varlen_collate(key="input_ids")),
             "PlanLoader pad": loader(pad_collate(key="input_ids")),
             "PlanLoader varlen": loader(varlen_collate(key="input_ids"))}
    notes: dict = {}
    try:
        import datasets
        import pyarrow as pa
        import pyarrow.parquet as pq

        datasets.disable_progress_bars()
        parquet = Path(plan).parent / (Path(plan).name + "-tokens.parquet")
        if not parquet.is_file():
            ids = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
            pq.write_table(pa.table({"input_ids": ids}), parquet, row_group_size=5000)
        hf = datasets.Dataset.from_parquet(str(parquet), cache_dir=str(Path(plan).parent / "hf-cache"))
        batches = [list(range(a, b)) for a, b in zip(lo.tolist(), hi.tolist())]

        def pad_rows(rows: list) -> dict:
            return {"input_ids": pad_sequence([r["input_ids"] for r in rows], batch_first=True, padding_value=0)}

        def hf_loop(workers: int):
            def loop() -> list:
                return _iterated(iter(DataLoader(hf.with_format("torch"), batch_sampler=batches, collate_fn=pad_rows,
                                                 num_workers=workers)), n)
            return loop
        loops["datasets w0"], loops["datasets w2"] = hf_loop(0), hf_loop(2)
    except ImportError as exc:
        notes["datasets"] = f"skipped: {exc}"
    try:
        sequences = max(1, tokens // budget)
        loops["megatron"] = _megatron(plan, budget, values, offsets, sequences)
        notes["megatron_sequences"] = sequences
    except ImportError as exc:
        notes["megatron"] = f"skipped: megatron-core not importable ({exc})"
    for name, loop in loops.items():  # warm: shards mapped, pages touched, workers' imports cached
        loop() if not name.startswith("datasets w2") else None
    # every loop is timed in blocks of BLOCK micro-batches, each block's best over the rounds: a block of
    # PlanLoader's fits between two preemptions of a busy machine as one of the numpy loop does, where a
    # whole epoch of it (tens of ms) cannot, so a whole-epoch time would flatter the numpy loop by the load
    walls: dict = {}
    cpus: dict = {}
    for _ in range(rounds):
        for name, loop in loops.items():
            for _ in range(2):  # twice in a row: the second finds the tokens in cache, whichever loop ran before
                got = loop()
                w, c = np.array([g[0] for g in got]), np.array([g[1] for g in got])
                walls[name] = w if name not in walls else np.minimum(walls[name], w)
                cpus[name] = c if name not in cpus else np.minimum(cpus[name], c)
    best = {k: float(v.sum()) for k, v in walls.items()}
    cpu = {k: float(v.sum()) for k, v in cpus.items()}
    notes["numpy"] = f"baseline; timed in blocks of {BLOCK} micro-batches, each block's best of the runs"
    return {"microbatches": n, "tokens": tokens, "samples": int((hi - lo).sum()), "seconds": best, "cpu": cpu,
            "notes": notes, "exposed": exposed(plan, order, rounds), "load": os.getloadavg()[0]}


STEP = 0.001  # seconds of a simulated training step that lets go of the GIL (a CUDA wait)


def exposed(plan: str, order: dict, rounds: int) -> dict:
    """Return, per loop, the best µs per micro-batch the loop waits for its batch beside a ``STEP`` step.

    What a training loop sees of the data loading: the fetch + collate run in the loop's
    thread (inline) are all exposed; ``PlanLoader`` prepares during the step.
    """
    from sortpack.torch import PackedBatchSampler, PlanLoader, SourceDataset, pad_collate

    collate = pad_collate(key="input_ids")
    ds, sampler = SourceDataset(plan), PackedBatchSampler(plan, **order)
    loader = PlanLoader(SourceDataset(plan), PackedBatchSampler(plan, **order), collate)

    def inline():
        sampler.set_epoch(0)
        return (collate(ds.__getitems__(mb)) for mb in sampler)

    def planned():
        loader.set_epoch(0)
        return iter(loader)

    best = {"inline pad": float("inf"), "PlanLoader pad": float("inf")}
    for _ in range(rounds):
        for name, start in (("inline pad", inline), ("PlanLoader pad", planned)):
            it, waited, n = start(), 0.0, 0
            while True:
                t0 = time.perf_counter()
                batch = next(it, None)
                waited += time.perf_counter() - t0
                if batch is None:
                    break
                n += 1
                time.sleep(STEP)
            best[name] = min(best[name], waited / n * 1e6)
    return best


HEADER = ["loop", "µs / mb (wall)", "µs / mb (CPU)", "tokens/s (wall)", "vs numpy (wall)", "vs numpy (CPU)", "note"]


def _rows(res: dict) -> list[list[str]]:
    """Return the table rows of one plan's result: µs per micro-batch, tokens/s and ratios to the numpy loop.

    Wall time is what a training loop waits; CPU time (every thread of the process) is what
    the loop costs, and holds still on a machine shared with other work.
    """
    n, tokens = res["microbatches"], res["tokens"]
    sec, cpu = dict(res["seconds"]), dict(res["cpu"])
    hf = [k for k in ("datasets w0", "datasets w2") if k in sec]
    if hf:
        fast = min(hf, key=sec.__getitem__)
        sec["datasets"], cpu["datasets"] = sec[fast], cpu[fast]
        res["notes"].setdefault("datasets", f"DataLoader(num_workers={fast[-1]}), the faster; CPU: main process")
    rows = []
    for name in LOOPS:
        if name not in sec:
            rows.append([name, "", "", "", "", "", res["notes"].get(name, "skipped")])
            continue
        per, note = n, res["notes"].get(name, "baseline" if name == "numpy" else "")
        if name == "megatron":
            per = res["notes"]["megatron_sequences"]
            note = f"per sequence of the budget ({per}): GPTDataset[i] through a BlendedDataset"
        rows.append([name, f"{sec[name] / per * 1e6:,.1f}", f"{cpu[name] / per * 1e6:,.1f}",
                     f"{tokens / sec[name]:,.0f}", f"{sec['numpy'] / sec[name]:.3f}x",
                     f"{cpu['numpy'] / cpu[name]:.3f}x", note])
    return rows


def render(results: dict) -> str:
    """Return every (checkout, plan) table as plain text."""
    out = []
    header = HEADER
    for code, plans in results["codes"].items():
        for plan, res in plans.items():
            out.append(f"\n{code} | {plan}: {res['microbatches']} micro-batches, {res['samples']} samples "
                       f"({res['samples'] / res['microbatches']:.1f} per micro-batch), {res['tokens']:,} tokens, "
                       f"best of {results['rounds']}, load {res.get('load', float('nan')):.1f}")
            rows = [header] + _rows(res)
            widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
            out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
            waits = ", ".join(f"{k} {v:,.1f} µs" for k, v in res.get("exposed", {}).items())
            out.append(f"beside a {STEP * 1e3:g} ms step that lets go of the GIL, the loop waits per micro-batch: "
                       f"{waits}")
    return "\n".join(out)


def goals(res: dict, plan: str) -> tuple[float, float, float]:
    """Return PlanLoader pad's (ratio to the numpy loop by wall time, by CPU time, wall µs per micro-batch)."""
    sec, cpu = res["seconds"], res["cpu"]
    return (sec["numpy"] / sec["PlanLoader pad"], cpu["numpy"] / cpu["PlanLoader pad"],
            sec["PlanLoader pad"] / res["microbatches"] * 1e6)


def run(scale: str, codes: list[str]) -> dict:
    """Build the plans, then measure each (checkout, plan) in its own process; return every result."""
    plans = build(scale)
    _, rounds = SCALES[scale]
    results: dict = {"scale": scale, "rounds": rounds, "codes": {c: {} for c in codes}, "load": None}
    for name, plan in plans.items():
        for code in codes:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(code), "OMP_NUM_THREADS": "1",
                   "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
            got = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure", plan,
                                  "--budget", str(PLANS[name]), "--rounds", str(rounds)],
                                 env=env, check=True, capture_output=True, text=True, cwd=ROOT)
            results["codes"][code][name] = json.loads(got.stdout.strip().splitlines()[-1])
    results["load"] = os.getloadavg()
    return results


def bench(ctx) -> list:
    """The suite's ``tokens_loop`` benchmark: this script in a subprocess, its tables as sections of the report."""
    from .report import Row, Section
    from .runner import missing_modules, script_results

    missing = missing_modules("torch", "tokenizers")
    if missing:
        return [Row("tokens_loop", "stored-token loop vs numpy", None, "skipped",
                    note=f"{', '.join(missing)} not installed")]
    results = script_results(ctx, Path(__file__).resolve(), WORK / f"tokens-loop-{ctx.scale_name}.json",
                             "stored-token loop")
    rows = []
    for plans in results["codes"].values():
        for plan, res in plans.items():
            ctx.sections.append(Section(f"Stored-token loop, {plan} plan ({res['microbatches']} micro-batches, "
                                        f"best of {results['rounds']}; `python benchmarks/bench_tokens_loop.py "
                                        f"--scale {results['scale']}`)",
                                        HEADER, _rows(res)))
            wall, ratio, us = goals(res, plan)
            want = 0.1 if plan == "long" else 0.5
            rows.append(Row("tokens_loop", f"PlanLoader + pad_collate, {plan} plan, wall µs per micro-batch", None,
                            f"{us:,.0f} µs", "numpy slice-and-pad loop", f"{wall:.2f}× (CPU {ratio:.2f}×)",
                            target=f"≥ {want}× numpy by wall time", met=wall >= want,
                            note=f"load {res.get('load', float('nan')):.1f}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with --measure, one measuring process) and print its tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--code", action="append", help="a checkout to time (repeatable; default: this one)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.budget, args.rounds)))
        return 0
    results = run(args.scale, args.code or [str(ROOT)])
    print(render(results), flush=True)
    for code, plans in results["codes"].items():
        for plan, res in plans.items():
            wall, ratio, us = goals(res, plan)
            want = 0.1 if plan == "long" else 0.5
            print(f"goal {code} | {plan}: PlanLoader pad {us:,.0f} wall µs per micro-batch, {wall:.3f}x numpy by "
                  f"wall time, {ratio:.3f}x by CPU time (want >= {want}x by wall time): "
                  f"{'met' if wall >= want else 'MISSED'} (load {res.get('load', float('nan')):.1f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
