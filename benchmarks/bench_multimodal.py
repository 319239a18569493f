"""Vision-language packing under several caps: fill and the LLM's and the encoder's step balance, sortpack against an
InternVL-style buffered greedy.

The set (``vl_set``): text tokens log-normal (median 400, sigma 1, 8..8192); 35% of the samples
text-only, the rest 1-8 images of 28-px multiples from 224 to 1,344 px a side, each
``(h/28)*(w/28)`` tokens as Qwen2-VL counts them (patch 14, 2x2 merge: 64..2,304 tokens) and four
times as many 14-px patches for its ViT. A sample's sequence is its text and image tokens. Three
caps per micro-batch: the sequence (``--max-tokens 16384``, ``--budget tokens``), the encoder
(8,192 image tokens: the images' tokens after the merge, i.e. 32,768 ViT patches) and 16 images.
A sample over a cap alone is drawn again (about 1%), so every sample fits and both packers see
the same samples. 1M samples at ``--scale full``, 100k at small.

Costs per micro-batch (as ``sortpack inspect`` counts them): the LLM's ``C*s + s^2`` per sample
(C = 6144), the encoder's ``C_e*p + p^2`` per image (C_e = 7680, p its patches: a full-attention
ViT such as Qwen2-VL's). Steps deal W consecutive micro-batches one to each rank (A = 1, the
short tail repeating the start, as the reader deals them); per W (8 and 64): p99 of the steps'
max/mean over ranks and ``weighted`` (sum of step maxima / sum of step means), for each cost.

- sortpack, one cap as before (``--size2`` image tokens ``--max-size2 8192``: runs of the sorted
  order, what the package did before several caps; no images cap);
- sortpack, three caps (``--cap enc=...:8192 --cap images=...:16``: best fit over all caps);
- the same with ``--balance compute --encoder-patches vit --encoder-attention full:vit_sq``;
- ``--rows 16384`` with the three caps and the same balance;
- InternVL's ``PackedDataset`` packing (``use_packed_ds``), re-implemented here: each rank
  streams its own shard in random order through a buffer of 20 packed sequences kept by image
  count (most first); a sample joins the first that fits it (InternVL checks the images and
  the tokens; the encoder cap is added so that both packers meet the same caps), a sequence
  leaves when full (16,384 tokens or 16 images) or when the buffer holds more than 20 (the
  one of most images goes); at the end the buffer empties. Its steps are each rank's k-th sequence.

Registered in ``suite.py`` as ``multimodal``: ``python -m benchmarks --only multimodal [--scale small|full]``.
"""
from __future__ import annotations

import shutil
import time

import numpy as np

from . import data
from .report import Row, Section, secs

SEQ, ENC, IMAGES = 16384, 8192, 16
C, C_E = 6144.0, 7680.0
WORLDS = (8, 64)
BUFFER = 20


def vl_set(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Return n vision-language samples (columns text, images, img, seq, patches, patches_sq), each within the caps."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("text", "images", "img", "seq", "patches", "patches_sq")}
    have = 0
    while have < n:
        m = n - have + 1024
        text = np.clip(np.rint(rng.lognormal(np.log(400), 1.0, m)), 8, 8192).astype(np.int64)
        count = np.where(rng.random(m) < 0.35, 0, rng.integers(1, 9, m))
        side = rng.integers(8, 49, (m, 8, 2))  # 28-px units: 224..1,344 px
        tokens = side[..., 0] * side[..., 1] * (np.arange(8)[None, :] < count[:, None])
        img = tokens.sum(axis=1)
        ok = (img <= ENC) & (text + img <= SEQ)
        patches = 4 * tokens  # the ViT's 14-px patches: 2x2 of them make a token
        cols = {"text": text, "images": count, "img": img, "seq": text + img, "patches": patches.sum(axis=1),
                "patches_sq": (patches * patches).sum(axis=1)}
        for k, v in cols.items():
            out[k].append(v[ok].astype(np.int64))
        have += int(ok.sum())
    return {k: np.concatenate(v)[:n] for k, v in out.items()}


def buffered_greedy(order: np.ndarray, s: dict[str, np.ndarray], buffer: int = BUFFER) -> list[list[int]]:
    """Return the packed sequences (sample lists) of InternVL's buffered greedy over one rank's stream ``order``."""
    tok, enc, nim = s["seq"].tolist(), s["img"].tolist(), s["images"].tolist()
    buffers: list[list] = []  # [images, tokens, encoder, samples], most images first
    out: list[list[int]] = []
    for i in order.tolist():
        at = next((j for j, b in enumerate(buffers) if b[0] + nim[i] <= IMAGES and b[1] + tok[i] <= SEQ
                   and b[2] + enc[i] <= ENC), None)
        b = buffers.pop(at) if at is not None else [0, 0, 0, []]
        b[0] += nim[i]
        b[1] += tok[i]
        b[2] += enc[i]
        b[3].append(i)
        if b[1] >= SEQ:
            out.append(b[3])
        else:
            where = next((j for j, o in enumerate(buffers) if o[0] < b[0]), len(buffers))
            buffers.insert(where, b)
        while buffers and buffers[0][0] == IMAGES:
            out.append(buffers.pop(0)[3])
        while len(buffers) > buffer:
            out.append(buffers.pop(0)[3])
    out.extend(b[3] for b in buffers)
    return out


def _costs(s: dict[str, np.ndarray], flat: np.ndarray, offsets: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return per micro-batch (LLM cost, encoder cost, binding fill) of samples ``flat[offsets[i]:offsets[i+1]]``."""
    seq = s["seq"].astype(np.float64)
    llm_s = C * seq + seq * seq
    enc_s = C_E * s["patches"].astype(np.float64) + s["patches_sq"].astype(np.float64)
    starts = offsets[:-1]

    def total(v):
        return np.add.reduceat(v[flat], starts)

    fill = np.maximum.reduce([total(seq) / SEQ, total(s["img"].astype(np.float64)) / ENC,
                              total(s["images"].astype(np.float64)) / IMAGES])
    return total(llm_s), total(enc_s), fill


def _imbalance(steps: np.ndarray) -> tuple[float, float]:
    """Return (p99 of max/mean over ranks, sum of step maxima / sum of step means) of a (steps, W) cost table."""
    mean, top = steps.mean(axis=1), steps.max(axis=1)
    ratio = np.where(mean > 0, top / np.where(mean > 0, mean, 1.0), 1.0)  # a step of no cost is balanced
    return float(np.quantile(ratio, 0.99)), float(top.sum() / mean.sum())


def baseline(s: dict[str, np.ndarray], seed: int = 1) -> dict:
    """Return the buffered greedy's fill and imbalances per W (each rank a shard of a random order)."""
    n = len(s["seq"])
    order = np.random.default_rng(seed).permutation(n)
    out: dict = {"wall": 0.0}
    for w in WORLDS:
        t0 = time.perf_counter()
        packs = [buffered_greedy(order[r::w], s) for r in range(w)]
        out["wall"] += time.perf_counter() - t0
        steps = min(len(p) for p in packs)
        per_rank = []
        fills = []
        for p in packs:
            flat = np.concatenate([np.asarray(x, np.int64) for x in p])
            offsets = np.concatenate(([0], np.cumsum([len(x) for x in p])))
            llm, enc, fill = _costs(s, flat, offsets)
            per_rank.append((llm[:steps], enc[:steps]))
            fills.append(fill)
        llm = np.stack([r[0] for r in per_rank], axis=1)
        enc = np.stack([r[1] for r in per_rank], axis=1)
        out[w] = {"llm": _imbalance(llm), "enc": _imbalance(enc), "fill": float(np.concatenate(fills).mean())}
    out["fill"] = out[64]["fill"]
    return out


def _plan(directory, s: dict[str, np.ndarray]) -> dict:
    """Return a sortpack plan's fill and imbalances per W (the reader's deal: ``inspect``'s step layout)."""
    from sortpack.reader import PackedIndex
    from sortpack.report.inspect import step_costs

    index = PackedIndex(directory)
    flat, offsets = [], [0]
    for k in range(index.num_microbatches):
        ids = index.microbatch(k)
        flat.append(ids)
        offsets.append(offsets[-1] + len(ids))
    llm, enc, fill = _costs(s, np.concatenate(flat), np.asarray(offsets))
    out: dict = {"fill": float(fill.mean()), "microbatches": index.num_microbatches}
    for w in WORLDS:
        out[w] = {"llm": _imbalance(step_costs(llm, w, 1)), "enc": _imbalance(step_costs(enc, w, 1))}
    return out


BALANCE = ["--balance", "compute", "--encoder-patches", "vit", "--encoder-attention", "full:vit_sq"]
THREE = ["--cap", f"enc=column:img:{ENC}", "--cap", f"images=column:images:{IMAGES}"]
RUNS = {
    "sortpack, one cap as before (runs)": ["--size2", "column:img", "--max-size2", str(ENC)],
    "sortpack, three caps (best fit)": THREE,
    "sortpack, three caps, --balance compute": THREE + BALANCE,
    "sortpack --rows, three caps, --balance compute": THREE + BALANCE,
}


def bench(ctx) -> list[Row]:
    """Return the rows: binding fill and both imbalances at W = 8 and 64, sortpack's plans and the buffered greedy."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .runner import sortpack_cli

    n = 1_000_000 if ctx.scale_name == "full" else 100_000
    work = data.work_dir("multimodal")
    ctx.log(f"generating {n} vision-language samples")
    s = vl_set(n)
    pq.write_table(pa.table(s), work / "vl.parquet")
    results: dict = {}
    for name, extra in RUNS.items():
        ctx.log(name)
        budget = ["--rows", str(SEQ)] if "--rows" in name else ["--budget", "tokens", "--max-tokens", str(SEQ)]
        wall = sortpack_cli(["run", str(work / "vl.parquet"), "-o", str(work / "plan"), "--size", "column:seq",
                             "--measure", "vit=column:patches", "--measure", "vit_sq=column:patches_sq",
                             *budget, *extra, "--cost-coeff", str(C), "--encoder-coeff", str(C_E), "--overwrite",
                             "--quiet"], ctx.scale.timeout, 1)
        results[name] = {"wall": wall, **_plan(work / "plan", s)}
    ctx.log(f"InternVL-style buffered greedy (buffer {BUFFER}) at W = {', '.join(map(str, WORLDS))}")
    results[f"InternVL buffered greedy (buffer {BUFFER})"] = baseline(s)
    section = Section(f"vision-language packing, {n // 1000}k samples, caps: sequence {SEQ}, encoder {ENC} image "
                      f"tokens, {IMAGES} images; LLM C*s + s^2 (C = {C:g}), encoder C_e*p + p^2 per image "
                      f"(C_e = {C_E:g}); A = 1",
                      ["packing", "binding fill", *(f"W={w} LLM p99 / weighted" for w in WORLDS),
                       *(f"W={w} encoder p99 / weighted" for w in WORLDS), "time"])
    for name, r in results.items():
        section.rows.append([name, f"{r['fill']:.4f}",
                             *(f"{r[w]['llm'][0]:.3f} / {r[w]['llm'][1]:.4f}" for w in WORLDS),
                             *(f"{r[w]['enc'][0]:.3f} / {r[w]['enc'][1]:.4f}" for w in WORLDS), secs(r["wall"])])
    ctx.sections.append(section)
    shutil.rmtree(work, ignore_errors=True)
    return _rows(ctx, results)


def _rows(ctx, results: dict) -> list[Row]:
    """Return the summary rows: the binding fill of best fit, and the p99 of both costs at W = 64 balanced."""
    full = ctx.scale_name == "full"
    base = results[f"InternVL buffered greedy (buffer {BUFFER})"]
    before = results["sortpack, one cap as before (runs)"]
    rows = []
    for name in ("sortpack, three caps (best fit)", "sortpack --rows, three caps, --balance compute"):
        r = results[name]
        rows.append(Row("multimodal", f"{name}: binding cap's mean fill", 1, f"{r['fill']:.4f}",
                        f"buffered greedy: {base['fill']:.4f}", "", "≥ 0.98", r["fill"] >= 0.98,
                        f"one cap, runs of the sorted order: {before['fill']:.4f}"))
    bal = results["sortpack, three caps, --balance compute"]
    # the target is stated on 1M samples: a small run's micro-batches are too few to fill every region of both costs
    target = "≤ 1.05" if full else ""
    for cost, label in (("llm", "LLM"), ("enc", "encoder")):
        rows.append(Row("multimodal", f"--balance compute with the encoder, W=64: p99 {label} imbalance", 1,
                        f"{bal[64][cost][0]:.3f}", f"buffered greedy: {base[64][cost][0]:.3f}", "", target,
                        bal[64][cost][0] <= 1.05 if full else None,
                        f"weighted {bal[64][cost][1]:.4f} (buffered greedy {base[64][cost][1]:.4f}); fill "
                        f"{bal['fill']:.4f} against {base['fill']:.4f}"))
    return rows


if __name__ == "__main__":  # python -m benchmarks.bench_multimodal [--scale small|full]: the suite's run of this one
    import sys

    from .suite import main

    sys.exit(main(["--only", "multimodal", *sys.argv[1:]]))
