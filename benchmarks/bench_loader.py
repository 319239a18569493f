"""Loader figures: batches/s from stored token ids, sortpack's documented loop against Hugging Face ``datasets``.

    PYTHONPATH=$PWD python benchmarks/bench_loader.py --scale small   # 20k samples, seconds (the suite's `loader`)
    PYTHONPATH=$PWD python benchmarks/bench_loader.py --scale full    # 100k samples, medians of 3 rounds

One Parquet file of pre-tokenized samples (``input_ids``, log-normal lengths, median ~245,
at most 4096) becomes a plan with ``sortpack run --column input_ids --max-tokens 16384
--store input_ids``. Every method then delivers the same padded batches (the plan's
micro-batches in the sampler's ``shuffle`` order, seed 1; checked: the first batches'
``input_ids`` are equal) to a loop that only counts their real samples:

(a) ``datasets``: ``Dataset.from_parquet`` (memory-mapped Arrow), ``with_format("torch")``,
    ``DataLoader(num_workers=2, collate_fn=DataCollatorWithPadding(tokenizer))`` with the
    plan's batches as ``batch_sampler``, as its "Use with PyTorch" guide and the transformers
    course do; also with a lean collate (``pad_sequence``) at ``num_workers=2`` and ``0``. The
    fastest of the three is the baseline;
(b) sortpack in process: ``pad_collate(key="input_ids")(SourceDataset(plan).__getitems__(mb))``
    for each micro-batch, no loader (the work itself);
(c) the documented loop: ``PlanLoader(SourceDataset(plan), sampler, pad_collate(key="input_ids"))``;
(d) for reference, sortpack through ``DataLoader(num_workers=2)``.

Goal: (c) at least 2x (a) and at least 50% of (b). Rounds interleave the methods
so all see the same background load; each figure is the median over rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "_work" / "loader"
SCALES = {"small": (10_000, 1), "full": (100_000, 3)}  # samples, rounds
MAX_TOKENS = 16384


def make_data(path: Path, n: int, seed: int = 0) -> None:
    """Write ``n`` pre-tokenized samples (``input_ids`` list<int32>, log-normal lengths) as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(5.5, 0.8, n).astype(np.int64) + 1, 4096)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    values = rng.integers(2, 32000, int(offsets[-1]), dtype=np.int32)
    ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)).cast(pa.list_(pa.int32()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.table({"input_ids": ids}), tmp, row_group_size=10_000)
    tmp.rename(path)


def build(n: int) -> tuple[Path, Path]:
    """Return (the Parquet input, the plan), written once per size under benchmarks/_work/loader."""
    data, plan = WORK / f"tokens-{n}.parquet", WORK / f"plan-{n}"
    if not data.exists():
        make_data(data, n)
    if not (plan / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "sortpack", "run", str(data), "-o", str(plan), "--column", "input_ids",
                        "--max-tokens", str(MAX_TOKENS), "--store", "input_ids", "--quiet", "--overwrite"],
                       check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return data, plan


def _hf_collator():
    """Return transformers' DataCollatorWithPadding over a tokenizer built in memory (pad id 0, no download)."""
    from tokenizers import Tokenizer, models
    from transformers import DataCollatorWithPadding, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1}, "[UNK]")),
                                  pad_token="[PAD]")
    tok.deprecation_warnings["Asking-to-pad-a-fast-tokenizer"] = True  # its one-time advice, not a figure
    return DataCollatorWithPadding(tok, return_tensors="pt")


def pad_rows(rows: list) -> dict:
    """Return a padded batch of ``datasets`` rows in torch format: a lean collate (``pad_sequence``)."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    ids = [r["input_ids"] for r in rows]
    lengths = torch.tensor([len(x) for x in ids])
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
    return {"input_ids": pad_sequence(ids, batch_first=True, padding_value=0), "attention_mask": mask}


def _count(batches, key: str) -> int:
    n = 0
    for batch in batches:
        n += int(batch[key].sum()) if key == "real" else int(batch[key].shape[0])
    return n


def run(scale: str) -> dict:
    """Measure every method over ``rounds`` interleaved rounds; return the medians and the setup."""
    import torch
    from torch.utils.data import DataLoader

    from sortpack.torch import PackedBatchSampler, PlanLoader, SourceDataset, pad_collate

    torch.set_num_threads(1)
    n, rounds = SCALES[scale]
    data, plan = build(n)
    import datasets

    datasets.disable_progress_bars()
    hf = datasets.Dataset.from_parquet(str(data), cache_dir=str(WORK / "hf-cache"))
    collator = _hf_collator()
    order = dict(order="shuffle", seed=1)
    batches = [list(mb) for mb in PackedBatchSampler(plan, rank=0, world_size=1, **order)]
    samples = sum(len(b) for b in batches)
    collate = pad_collate(key="input_ids")

    def hf_loop(collate_fn, workers: int):
        return DataLoader(hf.with_format("torch"), batch_sampler=batches, collate_fn=collate_fn, num_workers=workers)

    def in_process():
        ds, sampler = SourceDataset(plan), PackedBatchSampler(plan, rank=0, world_size=1, **order)
        return (collate(ds.__getitems__(mb)) for mb in sampler)

    def documented():
        sampler = PackedBatchSampler(plan, rank=0, world_size=1, **order)
        return PlanLoader(SourceDataset(plan), sampler, pad_collate(key="input_ids"))

    def through_workers():
        sampler = PackedBatchSampler(plan, rank=0, world_size=1, **order)
        loader = DataLoader(SourceDataset(plan), batch_sampler=sampler, collate_fn=collate, num_workers=2)
        for batch in loader:
            sampler.consume(batch)
            yield batch

    # the same batches: HF's padded input_ids equal sortpack's, batch for batch
    for ref, lean, got, _ in zip(hf_loop(collator, 0), hf_loop(pad_rows, 0), documented(), range(3)):
        assert torch.equal(ref["input_ids"], got["input_ids"]), "the methods see different batches"
        assert torch.equal(lean["input_ids"], got["input_ids"]), "the methods see different batches"

    methods = {
        "hf_collator_w2": (lambda: hf_loop(collator, 2), "input_ids"),
        "hf_pad_w2": (lambda: hf_loop(pad_rows, 2), "input_ids"),
        "hf_pad_w0": (lambda: hf_loop(pad_rows, 0), "input_ids"),
        "in_process": (in_process, "real"),
        "documented": (documented, "real"),
        "workers": (through_workers, "real"),
    }
    rates: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(rounds):
        for name, (make, key) in methods.items():
            t0 = time.perf_counter()
            got = _count(make(), key)
            dt = time.perf_counter() - t0
            assert got == samples, (name, got, samples)
            rates[name].append(samples / dt)
    med = {k: statistics.median(v) for k, v in rates.items()}
    hf_best = max(("hf_collator_w2", "hf_pad_w2", "hf_pad_w0"), key=med.__getitem__)
    return {"scale": scale, "samples": samples, "microbatches": len(batches), "rounds": rounds,
            "samples_per_microbatch": samples / len(batches), "rates": rates, "median": med, "hf_best": hf_best,
            "vs_hf": med["documented"] / med[hf_best], "vs_in_process": med["documented"] / med["in_process"],
            "load": os.getloadavg(), "cores": os.cpu_count(),
            "versions": {"torch": torch.__version__, "datasets": datasets.__version__}}


LABELS = {
    "hf_collator_w2": "(a) datasets, with_format(\"torch\"), DataLoader(num_workers=2), DataCollatorWithPadding",
    "hf_pad_w2": "(a) datasets, with_format(\"torch\"), DataLoader(num_workers=2), pad_sequence collate",
    "hf_pad_w0": "(a) datasets, with_format(\"torch\"), DataLoader(num_workers=0), pad_sequence collate",
    "in_process": "(b) sortpack in process: pad_collate(key=\"input_ids\")(SourceDataset.__getitems__(mb))",
    "documented": "(c) sortpack documented loop: PlanLoader(SourceDataset, sampler, pad_collate(key=\"input_ids\"))",
    "workers": "(d) sortpack through DataLoader(num_workers=2)",
}


def table(res: dict) -> tuple[list[str], list[list[str]]]:
    """Return (header, rows) of the result table."""
    rows = []
    for k, label in LABELS.items():
        m = res["median"][k]
        note = "baseline (fastest of (a))" if k == res["hf_best"] else ""
        rows.append([label, f"{m:,.0f}", f"{m / res['median'][res['hf_best']]:.2f}x",
                     f"{m / res['median']['in_process']:.0%}", note])
    return ["method", "samples/s (median)", "vs (a)", "vs (b)", ""], rows


def render(res: dict) -> str:
    """Return the result as plain text."""
    header, rows = table(res)
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header] + rows]
    goal = (f"goal: (c) >= 2x (a): {res['vs_hf']:.2f}x {'met' if res['vs_hf'] >= 2 else 'MISSED'}; "
            f"(c) >= 50% of (b): {res['vs_in_process']:.0%} {'met' if res['vs_in_process'] >= 0.5 else 'MISSED'}")
    load = "/".join(f"{x:.1f}" for x in res["load"])
    return "\n".join(lines + [goal, f"{res['samples']} samples in {res['microbatches']} micro-batches "
                              f"({res['samples_per_microbatch']:.1f} per micro-batch), {res['rounds']} rounds, "
                              f"load average at the end {load} on {res['cores']} cores"])


def bench(ctx) -> list:
    """The suite's ``loader`` benchmark: this script in a subprocess, its table as a section of the report."""
    from .report import Row, Section
    from .runner import missing_modules, script_results

    missing = missing_modules("torch", "datasets", "transformers")
    if missing:
        return [Row("loader", "loader: documented loop vs datasets", None, "skipped",
                    note=f"{', '.join(missing)} not installed")]
    res = script_results(ctx, Path(__file__).resolve(), WORK / f"loader-{ctx.scale_name}.json", "loader")
    header, rows = table(res)
    ctx.sections.append(Section(f"Loader ({res['scale']} scale, {res['samples']} samples, medians of "
                                f"{res['rounds']}; `python benchmarks/bench_loader.py --scale {res['scale']}`)",
                                header, rows))
    return [Row("loader", "documented stored-token-ids loop (PlanLoader), samples/s", None,
                f"{res['median']['documented']:,.0f}", f"datasets: {res['median'][res['hf_best']]:,.0f}",
                f"{res['vs_hf']:.2f}×", target="≥ 2× datasets, ≥ 50% of in-process",
                met=res["vs_hf"] >= 2 and res["vs_in_process"] >= 0.5,
                note=f"{res['vs_in_process']:.0%} of in-process fetch + collate")]


def main(argv: list[str] | None = None) -> int:
    """Run the loader benchmark and print its table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    warnings.filterwarnings("ignore", message=".*fast tokenizer.*")
    res = run(args.scale)
    print(render(res), flush=True)
    from benchmarks.report import save_json

    save_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
