"""The loader doors and the attention metadata: per-step cost against ``PlanLoader``, block masks against torch's.

    PYTHONPATH=$PWD python benchmarks/bench_doors.py --scale small   # 10k samples, 2 rounds, an 8k-token row (`doors`)
    PYTHONPATH=$PWD python benchmarks/bench_doors.py --scale full    # 100k samples, 7 rounds

(1) The doors. The plan of ``bench_loader`` (pre-tokenized ``input_ids``, log-normal lengths,
``--max-tokens 16384 --store input_ids``) read by one rank of one in ``shuffle`` order, each
batch ``pad_collate(key="input_ids")``, each step a fixed piece of torch work (a 256x256
matmul chain, about a millisecond, that lets go of the GIL as a model's kernels do) through:

- ``PlanLoader(SourceDataset(plan), sampler, collate)``: the baseline;
- ``PlanNode(sampler, SourceDataset(plan), collate)`` iterated as a node, and inside
  ``torchdata.nodes.Loader`` (how torchdata users hold it);
- ``PlanDataModule(plan, collate)``'s ``train_dataloader()`` with a real ``lightning.Trainer``
  attached (CPU, one device): the loader Lightning iterates, without Lightning's own loop.

Each figure is the wall time per step of a whole epoch, median over rounds that interleave the
methods, each round starting with the next one (all see the same background load, none is
always first). Goal: each door within 5% of ``PlanLoader``.

(2) The attention metadata. One packed row of 32,768 tokens (8,192 at small scale; documents of log-normal
lengths, median 600), tiles of 128: ``flex_blocks.document_blocks`` (numpy, from the
boundaries) against ``create_block_mask(mask_mod, 1, None, L, L, device="cpu")`` of the same
causal document mask, both in this run (checked equal, element for element), best of several
calls each. Goal: the numpy metadata at least 100x cheaper.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "_work" / "doors"
# samples, rounds, create_block_mask calls (one of a 32k-token row takes 10-30 s on a 2-core machine), the row's tokens
SCALES = {"small": (10_000, 2, 1, 8_192), "full": (100_000, 7, 2, 32_768)}
BLOCK = 128
OVERHEAD_GOAL, BLOCKS_GOAL = 1.05, 100.0
LABELS = {
    "loader": "PlanLoader(SourceDataset, sampler, pad_collate) (baseline)",
    "node": "PlanNode(sampler, SourceDataset, pad_collate)",
    "node_loader": "torchdata.nodes.Loader(PlanNode(...))",
    "datamodule": "PlanDataModule(plan, pad_collate).train_dataloader() under a lightning.Trainer",
}


def _work(weights) -> None:
    """The training step's stand-in: a chain of matmuls (torch lets go of the GIL inside each)."""
    x = weights[0]
    for w in weights[1:]:
        x = x @ w


def doors(scale: str) -> dict:
    """Return the per-step seconds of each method (every round) and the epoch's steps."""
    import lightning as L
    import torch
    import torchdata.nodes as tn

    from benchmarks.bench_loader import build
    from sortpack.lightning import PlanDataModule
    from sortpack.torch import PackedBatchSampler, PlanLoader, PlanNode, SourceDataset, pad_collate

    torch.set_num_threads(1)
    n, rounds, _, _ = SCALES[scale]
    _, plan = build(n)
    weights = [torch.randn(256, 256, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    collate = pad_collate(key="input_ids")

    def sampler():
        return PackedBatchSampler(plan, rank=0, world_size=1, order="shuffle", seed=1)

    def datamodule():
        trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        dm = PlanDataModule(plan, collate, order="shuffle", seed=1)
        dm.trainer = trainer
        dm.setup("fit")
        return dm.train_dataloader()

    methods = {
        "loader": lambda: PlanLoader(SourceDataset(plan), sampler(), collate),
        "node": lambda: PlanNode(sampler(), SourceDataset(plan), collate),
        "node_loader": lambda: tn.Loader(PlanNode(sampler(), SourceDataset(plan), collate)),
        "datamodule": datamodule,
    }
    steps = len(sampler())
    per_step: dict[str, list[float]] = {k: [] for k in methods}
    names = list(methods)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            make = methods[name]
            batches = make()
            t0 = time.perf_counter()
            got = 0
            for batch in batches:
                got += int(batch["real"].sum())
                _work(weights)
            dt = time.perf_counter() - t0
            assert got > 0 and (name != "loader" or got == sum(len(mb) for mb in sampler())), name
            per_step[name].append(dt / steps)
    return {"steps": steps, "per_step": per_step, "median": {k: statistics.median(v) for k, v in per_step.items()}}


def blocks(scale: str) -> dict:
    """Return the best seconds of the numpy block metadata and of ``create_block_mask`` for one row (32k tokens at
    full scale, 8k in the smoke run)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from sortpack.reader.flex_blocks import BLOCK_KEYS, document_blocks

    calls, row = SCALES[scale][2:]
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(rng.lognormal(np.log(600), 1.0, 400)), 1, row).astype(np.int64)
    cu = np.concatenate(([0], np.cumsum(lengths)))
    cu = np.concatenate((cu[cu < row], [row]))  # documents until the row is full, the last one cut
    doc = torch.from_numpy(np.searchsorted(cu, np.arange(row), side="right").reshape(1, row))

    def mask_mod(b, h, q, kv):
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    numpy_s, torch_s = [], []
    for _ in range(200):
        t0 = time.perf_counter()
        got = document_blocks(cu, 1, row, BLOCK)
        numpy_s.append(time.perf_counter() - t0)
    for _ in range(calls):
        t0 = time.perf_counter()
        ref = create_block_mask(mask_mod, 1, None, row, row, device="cpu", BLOCK_SIZE=BLOCK)
        torch_s.append(time.perf_counter() - t0)
    same = all(np.array_equal(getattr(got, k), getattr(ref, k).numpy()) for k in BLOCK_KEYS)
    return {"numpy_s": min(numpy_s), "torch_s": min(torch_s), "documents": len(cu) - 1, "same": same,
            "calls": calls, "row": row}


def run(scale: str) -> dict:
    """Measure both parts; return the result with the load average and versions."""
    import lightning
    import torch
    import torchdata

    res = {"scale": scale, "doors": doors(scale), "blocks": blocks(scale), "load": os.getloadavg(),
           "cores": os.cpu_count(), "versions": {"torch": torch.__version__, "torchdata": torchdata.__version__,
                                                 "lightning": lightning.__version__}}
    return res


def tables(res: dict) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """Return (header, door rows, block rows) of the result."""
    med = res["doors"]["median"]
    base = med["loader"]
    rows = [[LABELS[k], f"{med[k] * 1e3:.3f} ms", f"{med[k] / base:.3f}x", "baseline" if k == "loader" else
             ("met" if med[k] / base <= OVERHEAD_GOAL else "MISSED")] for k in LABELS]
    b = res["blocks"]
    ratio = b["torch_s"] / b["numpy_s"]
    block_rows = [[f"create_block_mask, one {b['row']}-token row, B={BLOCK} (CPU, best of {b['calls']})",
                   f"{b['torch_s'] * 1e3:.1f} ms", "1x", "baseline"],
                  [f"document_blocks (numpy, from {b['documents']} document boundaries)",
                   f"{b['numpy_s'] * 1e3:.3f} ms", f"{ratio:,.0f}x cheaper",
                   "met" if ratio >= BLOCKS_GOAL and b["same"] else "MISSED"]]
    return ["method", "per step / per row", "vs baseline", "goal"], rows, block_rows


def render(res: dict) -> str:
    """Return the result as plain text."""
    from benchmarks.report import plain

    header, rows, block_rows = tables(res)
    load = "/".join(f"{x:.1f}" for x in res["load"])
    return "\n".join([plain(header, rows + block_rows),
                      f"{res['doors']['steps']} steps per epoch; block metadata equal to create_block_mask's: "
                      f"{res['blocks']['same']}; load average at the end {load} on {res['cores']} cores; "
                      f"{res['versions']}"])


def bench(ctx) -> list:
    """The suite's ``doors`` benchmark: this script in a subprocess, its tables as a section of the report."""
    from .report import Row, Section
    from .runner import missing_modules, script_results

    missing = missing_modules("torch", "torchdata", "lightning")
    if missing:
        return [Row("doors", "doors: PlanNode / PlanDataModule vs PlanLoader", None, "skipped",
                    note=f"{', '.join(missing)} not installed")]
    res = script_results(ctx, Path(__file__).resolve(), WORK / f"doors-{ctx.scale_name}.json", "doors")
    header, rows, block_rows = tables(res)
    ctx.sections.append(Section(f"Loader doors and attention metadata ({res['scale']} scale; "
                                f"`python benchmarks/bench_doors.py --scale {res['scale']}`)", header,
                                rows + block_rows))
    med, b = res["doors"]["median"], res["blocks"]
    out = []
    for k in ("node", "node_loader", "datamodule"):
        ratio = med[k] / med["loader"]
        out.append(Row("doors", f"{LABELS[k]}, per step", None, f"{med[k] * 1e3:.3f} ms",
                       f"PlanLoader: {med['loader'] * 1e3:.3f} ms", f"{ratio:.3f}×", target="≤ 1.05× PlanLoader",
                       met=ratio <= OVERHEAD_GOAL))
    ratio = b["torch_s"] / b["numpy_s"]
    out.append(Row("doors", f"flex block metadata of a {b['row']}-token row (B={BLOCK}), numpy", None,
                   f"{b['numpy_s'] * 1e3:.3f} ms", f"create_block_mask: {b['torch_s'] * 1e3:.1f} ms",
                   f"{ratio:,.0f}× cheaper", target=f"≥ {BLOCKS_GOAL:g}× cheaper, equal",
                   met=ratio >= BLOCKS_GOAL and b["same"]))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    warnings.filterwarnings("ignore")  # Lightning's advice on a Trainer that never fits: not a figure
    res = run(args.scale)
    print(render(res), flush=True)
    from benchmarks.report import save_json

    save_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
