"""The training payoff: real tokens/s of one model on one sample set under five batchings.

    PYTHONPATH=$PWD python -m benchmarks.train_payoff --scale full     # a CUDA GPU (the full sizes)
    PYTHONPATH=$PWD python -m benchmarks.train_payoff --scale small    # CPU toy: runs in seconds, no thresholds

One GPT-style model (fresh weights per method, same seed) and one set of samples with
log-normal token counts; every method trains for a fixed wall time after its warm-up and
reports real (unpadded) tokens/s, padding, distinct batch shapes, compile time and peak
memory. The baselines are written here: ``random`` (shuffle, fixed samples per batch, pad
to the longest) and ``group_by_length`` (Hugging Face's megabatch idea: shuffle, cut into
megabatches of 50 batches, sort each by length, longest first). The sortpack methods build
their plans with the real CLI (``sortpack run`` on a Parquet file of token counts,
``--size column:n``) and train through the public reader (``PackedBatchSampler``,
``PackedDataset``, ``pad_collate``/``varlen_collate``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .data import WORK

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TrainScale:
    """Model, data and timing of one scale."""

    samples: int
    median: float  # of the log-normal token counts
    sigma: float
    max_len: int  # counts are clipped to [1, max_len]
    vocab: int
    layers: int
    dim: int
    heads: int
    batch: int  # samples per batch of the baselines
    budget: int  # padded tokens per sortpack micro-batch
    shapes: str  # --shapes of the static-shape method
    rows: int  # --rows ROW_LEN of the rows method
    rows_per_mb: int
    seconds: float  # measured time per method, after warm-up
    warmup_steps: int
    workers: int  # DataLoader worker processes


SCALES = {
    "small": TrainScale(3000, 30, 0.8, 256, 256, 2, 64, 2, 16, 1024, "32,64,128,256", 256, 4, 2.0, 2, 0),
    "full": TrainScale(200_000, 300, 1.0, 4096, 32768, 8, 1024, 16, 16, 32768, "256,512,1024,2048,4096", 4096,
                       8, 60.0, 10, 6),
}


# --- data: one token sequence per sample, its length given by the sample set ----------------------------
def lengths(scale: TrainScale, seed: int = 0) -> np.ndarray:
    """Return the sample set's token counts: log-normal, clipped to [1, max_len]."""
    rng = np.random.default_rng(seed)
    n = rng.lognormal(math.log(scale.median), scale.sigma, scale.samples)
    return np.clip(np.ceil(n), 1, scale.max_len).astype(np.int64)


class TokenDataset:
    """Map-style dataset: sample i is ``lengths[i]`` token ids (a deterministic function of i)."""

    def __init__(self, lens: np.ndarray, vocab: int):
        self.lens, self.vocab = lens, vocab

    def __len__(self) -> int:
        """Return the number of samples."""
        return len(self.lens)

    def __getitem__(self, i) -> np.ndarray:
        """Return sample i's token ids (never 0, the padding id)."""
        i = int(i)
        return 1 + (np.arange(self.lens[i], dtype=np.int64) * 7919 + i * 104729) % (self.vocab - 1)


def random_batches(lens: np.ndarray, batch: int, seed: int) -> list[list[int]]:
    """Return a shuffled order cut into batches of ``batch`` samples (the plain DataLoader)."""
    order = np.random.default_rng(seed).permutation(len(lens))
    return [order[i:i + batch].tolist() for i in range(0, len(order), batch)]


def group_by_length_batches(lens: np.ndarray, batch: int, seed: int, mega: int = 50) -> list[list[int]]:
    """Return HF-style length-grouped batches: shuffle, megabatches of ``mega`` batches sorted by length."""
    order = np.random.default_rng(seed).permutation(len(lens))
    out = []
    for a in range(0, len(order), mega * batch):
        chunk = order[a:a + mega * batch]
        chunk = chunk[np.argsort(-lens[chunk], kind="stable")]  # longest first, as HF's LengthGroupedSampler
        out.extend(chunk[i:i + batch].tolist() for i in range(0, len(chunk), batch))
    return out


def build_index(lens: np.ndarray, work: Path, name: str, options: list[str]) -> Path:
    """Write the token counts as Parquet once and run ``sortpack run --size column:n OPTIONS``; return the index."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = work / "lengths.parquet"  # rewritten every time (cheap): never an older sample set
    pq.write_table(pa.table({"n": pa.array(lens, pa.int32())}), data, row_group_size=1 << 16)
    out = work / name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "sortpack", "run", str(data), "-o", str(out), "--size", "column:n",
                           "--overwrite", "--quiet", *options], capture_output=True, text=True, env=env,
                          timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"sortpack run {' '.join(options)} failed: {proc.stderr.strip()[-500:]}")
    return out


# --- model ---------------------------------------------------------------------------------------------
def make_model(scale: TrainScale, device: str):
    """Return a GPT-style causal LM (pre-norm blocks, learned positions, untied head)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = scale.dim
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))

        def forward(self, x, attend):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, scale.heads, d // scale.heads).permute(2, 0, 3, 1, 4)
            x = x + self.out(attend(q, k, v).transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.norm2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(scale.vocab, scale.dim)
            self.pos = nn.Embedding(scale.max_len, scale.dim)
            self.blocks = nn.ModuleList([Block() for _ in range(scale.layers)])
            self.norm, self.head = nn.LayerNorm(scale.dim), nn.Linear(scale.dim, scale.vocab, bias=False)

        def forward(self, ids, positions, attend):
            x = self.embed(ids) + self.pos(positions)
            for block in self.blocks:
                x = block(x, attend)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    return GPT().to(device)


def causal_sdpa(q, k, v):
    """Causal attention; right padding needs no mask: real queries never reach later (padding) keys."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def padded_loss(model, batch, device):
    """Return the loss of a ``pad_collate`` batch (targets at padding ignored)."""
    import torch
    import torch.nn.functional as F

    ids = batch["input_ids"].to(device, non_blocking=True)
    pad = batch["key_padding_mask"].to(device, non_blocking=True)
    positions = torch.arange(ids.shape[1], device=device).expand_as(ids)
    logits = model(ids, positions, causal_sdpa)
    targets = ids[:, 1:].masked_fill(pad[:, 1:], -100)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def rows_loss_fn(width: int, device: str, compiled: bool):
    """Return a loss function for rows-mode ``varlen_collate`` batches with a document mask.

    On CUDA the mask is a flex_attention block mask; on a CPU (torch 2.13's flex_attention has
    no CPU backward) the same mask_mod becomes a dense mask for scaled_dot_product_attention.
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False) if compiled and device == "cuda" else flex_attention

    def loss(model, batch):
        rows = batch["input_ids"].numel() // width
        ids = batch["input_ids"].view(rows, width).to(device, non_blocking=True)
        positions = batch["position_ids"].view(rows, width).to(device, non_blocking=True)
        real = batch["token_mask"].view(rows, width).to(device, non_blocking=True)
        seg = batch["cu_seqlens"].diff().long()
        doc = torch.repeat_interleave(torch.arange(len(seg)), seg).view(rows, width).to(device)

        def mask_mod(b, h, q, kv):
            return (doc[b, q] == doc[b, kv]) & (q >= kv)
        if device == "cuda":
            block_mask = create_block_mask(mask_mod, rows, None, width, width, device=device)

            def attend(q, k, v):
                return flex(q, k, v, block_mask=block_mask)
        else:
            dense = create_mask(mask_mod, rows, 1, width, width, device=device)

            def attend(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        logits = model(ids, positions, attend)
        ok = real[:, 1:] & (positions[:, 1:] > 0)
        targets = ids[:, 1:].masked_fill(~ok, -100)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
    return loss


# --- one method ----------------------------------------------------------------------------------------
@dataclass
class Result:
    """What one method measured."""

    method: str
    tokens_per_s: float
    padding: float  # padding tokens / computed tokens, over the measured steps
    shapes: int  # distinct (rows, length) shapes over every step run
    compile_s: float  # wall time of the steps that met a new shape (compiled methods; else 0)
    peak_mem_gb: float | None  # CUDA peak allocated; None on a CPU
    steps: int
    note: str = ""


def run_method(name: str, scale: TrainScale, loader_factory, loss_fn, device: str, compile_backend: str | None,
               warmup_until_all_shapes: bool = False, note: str = "", compiles_inside: bool = False) -> Result:
    """Train ``name`` for its warm-up, then ``scale.seconds``; return its figures.

    ``compile_backend`` compiles the whole loss (one graph per shape); ``compiles_inside`` says the
    loss compiles a part itself (flex_attention), so that its new-shape steps count as compile time.
    """
    import torch

    model = make_model(scale, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    step_loss = loss_fn
    if compile_backend:
        torch._dynamo.config.recompile_limit = 64
        step_loss = torch.compile(loss_fn, dynamic=False, backend=compile_backend)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    seen: set = set()
    compile_s, steps, measured, real, computed = 0.0, 0, False, 0, 0
    t_measure = 0.0
    epoch = 0
    while True:
        for batch in loader_factory(epoch):
            shape = tuple(batch["input_ids"].shape) if batch["input_ids"].dim() == 2 else (
                batch["input_ids"].numel(),)
            new = shape not in seen
            seen.add(shape)
            t0 = time.perf_counter()
            with amp:
                loss = step_loss(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if (compile_backend or compiles_inside) and new:
                compile_s += time.perf_counter() - t0
            steps += 1
            if not measured:
                warm = steps >= scale.warmup_steps and not (warmup_until_all_shapes and new)
                if warm:
                    measured, t_measure, steps_at = True, time.perf_counter(), steps
                continue
            real += int(batch["lengths"].sum())
            computed += batch["input_ids"].numel()
            if time.perf_counter() - t_measure >= scale.seconds:
                elapsed = time.perf_counter() - t_measure
                peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
                return Result(name, real / elapsed, 1 - real / max(1, computed), len(seen), compile_s, peak,
                              steps - steps_at, note)
        epoch += 1


def run_all(scale_name: str, scale: TrainScale, methods: list[str] | None = None,
            work: Path | None = None) -> tuple[list[Result], dict]:
    """Run every method at ``scale`` (indexes under ``work``); return the results and a description of the setup."""
    import torch
    from torch.utils.data import DataLoader

    from sortpack.torch import PackedBatchSampler, PackedDataset, pad_collate, varlen_collate

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # a toy model: more threads only contend (CI machines are small and shared)
    work = work or WORK / f"train-{scale_name}"
    work.mkdir(parents=True, exist_ok=True)
    lens = lengths(scale)
    ds = TokenDataset(lens, scale.vocab)
    # compile on a CPU toy would spend the whole CI budget in inductor: aot_eager there
    backend = "inductor" if device == "cuda" else "aot_eager"
    common = {"num_workers": scale.workers, "pin_memory": device == "cuda",
              "persistent_workers": False, "prefetch_factor": 4 if scale.workers else None}

    def plain(batches_of):
        return lambda epoch: DataLoader(ds, batch_sampler=batches_of(epoch), collate_fn=pad_collate(), **common)

    def packed(index, collate, **kw):
        sampler = PackedBatchSampler(index, rank=0, world_size=1, order="shuffle", seed=0, **kw)

        def make(epoch):
            sampler.set_epoch(epoch)
            return DataLoader(PackedDataset(ds), batch_sampler=sampler, collate_fn=collate, **common)
        return make

    want = methods or ["random", "group_by_length", "sortpack_padded", "sortpack_shapes_compile",
                       "sortpack_rows_flex"]
    results = []
    for name in want:
        print(f"  .. {name}", flush=True)
        if name == "random":
            r = run_method(name, scale, plain(lambda e: random_batches(lens, scale.batch, e)),
                           lambda m, b: padded_loss(m, b, device), device, None,
                           note=f"{scale.batch} samples per batch, eager")
        elif name == "group_by_length":
            r = run_method(name, scale, plain(lambda e: group_by_length_batches(lens, scale.batch, e)),
                           lambda m, b: padded_loss(m, b, device), device, None,
                           note=f"{scale.batch} per batch, megabatches of 50, eager")
        elif name == "sortpack_padded":
            ix = build_index(lens, work, "padded", ["--max-tokens", str(scale.budget)])
            r = run_method(name, scale, packed(ix, pad_collate()), lambda m, b: padded_loss(m, b, device), device,
                           None, note=f"--max-tokens {scale.budget}, eager")
        elif name == "sortpack_shapes_compile":
            ix = build_index(lens, work, "shapes", ["--max-tokens", str(scale.budget), "--shapes", scale.shapes])
            r = run_method(name, scale, packed(ix, pad_collate(), warmup_shapes=True),
                           lambda m, b: padded_loss(m, b, device), device, backend, warmup_until_all_shapes=True,
                           note=f"--shapes {scale.shapes} --max-tokens {scale.budget}, torch.compile(dynamic=False, "
                                f"backend={backend}), warmup_shapes")
        elif name == "sortpack_rows_flex":
            ix = build_index(lens, work, "rows", ["--rows", str(scale.rows), "--rows-per-microbatch",
                                                  str(scale.rows_per_mb)])
            attn = "torch.compile(flex_attention) with a document block mask" if device == "cuda" else \
                "eager, the document mask dense in SDPA (torch 2.13's flex_attention has no CPU backward)"
            # the block mask is built eagerly per micro-batch and only flex_attention is compiled: a compiled
            # whole step would specialise on each micro-batch's number of documents
            r = run_method(name, scale, packed(ix, varlen_collate()), rows_loss_fn(scale.rows, device, True), device,
                           None, warmup_until_all_shapes=True, compiles_inside=device == "cuda",
                           note=f"--rows {scale.rows} --rows-per-microbatch {scale.rows_per_mb}, {attn}")
        else:
            raise SystemExit(f"unknown method {name!r}")
        print(f"     {r.tokens_per_s:,.0f} real tokens/s, padding {100 * r.padding:.2f}%, {r.shapes} shapes",
              flush=True)
        results.append(r)
    setup = {"scale": scale_name, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
             "torch": torch.__version__, **asdict(scale),
             "params_m": sum(p.numel() for p in make_model(scale, "cpu").parameters()) / 1e6}
    return results, setup


def table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """Return the markdown table's header and rows."""
    header = ["batching", "real tokens/s", "padding", "distinct shapes", "compile (steps meeting a new shape)",
              "peak GPU memory", "measured steps", "setup"]
    rows = [[r.method, f"{r.tokens_per_s:,.0f}", f"{100 * r.padding:.2f}%", str(r.shapes),
             f"{r.compile_s:.1f} s" if r.compile_s else "—",
             f"{r.peak_mem_gb:.1f} GB" if r.peak_mem_gb is not None else "— (CPU)", str(r.steps), r.note]
            for r in results]
    return header, rows


def render(results: list[Result], setup: dict, command: str) -> str:
    """Return the markdown report."""
    header, rows = table(results)
    md = ["# Training payoff", "", f"Command: `{command}`", "",
          (f"Device: {setup['device']}, torch {setup['torch']}; model: {setup['layers']} layers, d={setup['dim']}, "
          f"{setup['heads']} heads, vocab {setup['vocab']} ({setup['params_m']:.1f} M parameters); "
          f"{setup['samples']} samples, log-normal lengths (median {setup['median']}, sigma {setup['sigma']}, "
          f"max {setup['max_len']}); each method measured for {setup['seconds']} s after "
          f"{setup['warmup_steps']} warm-up steps (and, compiled methods, after every shape was met); "
          f"DataLoader workers: {setup['workers']}."), "",
          "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    if setup["scale"] == "small":
        md += ["", "Small scale is a toy that checks every method runs; its figures say nothing about a GPU."]
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the payoff benchmark, print and write the markdown table (and JSON with --json)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.train_payoff", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--methods", help="comma-separated subset (default: all five)")
    ap.add_argument("--seconds", type=float, help="measured seconds per method (default: the scale's)")
    ap.add_argument("--results", type=Path, help="markdown report (default: benchmarks/RESULTS-gpu.md for full "
                                                 "scale on CUDA, else benchmarks/_work/RESULTS-train-<scale>.md)")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    scale = SCALES[args.scale]
    if args.seconds:
        scale = TrainScale(**{**asdict(scale), "seconds": args.seconds})
    command = "python -m benchmarks.train_payoff " + " ".join(sys.argv[1:] if argv is None else argv)
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else None
    results, setup = run_all(args.scale, scale, methods)
    report = render(results, setup, command)
    print(report)
    target = args.results
    if target is None:
        gpu = args.scale == "full" and setup["device"] != "cpu" and methods is None
        target = ROOT / "benchmarks" / "RESULTS-gpu.md" if gpu else WORK / f"RESULTS-train-{args.scale}.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(report)
    if args.json:
        args.json.write_text(json.dumps({"setup": setup, "results": [asdict(r) for r in results]}))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def bench(ctx) -> list:
    """The suite's ``train`` benchmark: this module in a subprocess, its table as a section of the report.

    Full scale needs CUDA; without it the suite runs the CPU toy and says so.
    """
    import importlib.util

    from .report import Row, Section
    from .runner import launch

    if importlib.util.find_spec("torch") is None:
        return [Row("train", "training payoff", None, "skipped", note="torch is not installed")]
    import torch

    scale = "full" if ctx.scale_name == "full" and torch.cuda.is_available() else "small"
    out = WORK / f"train-{scale}.json"
    args = ["--scale", scale, "--json", str(out)] + (["--seconds", "1"] if scale == "small" else [])
    ctx.log(f"training payoff at scale {scale}" + ("" if scale == ctx.scale_name else " (no CUDA GPU here)"))
    launch([sys.executable, "-m", "benchmarks.train_payoff", *args], 600 if scale == "small" else 3600)
    res = json.loads(out.read_text())
    header, rows = table([Result(**r) for r in res["results"]])
    s = res["setup"]
    ctx.sections.append(Section(f"Training payoff ({scale} scale, {s['device']}, {s['params_m']:.1f} M parameters, "
                                f"{s['samples']} samples; `python -m benchmarks.train_payoff --scale {scale}`)",
                                header, rows))
    return []
