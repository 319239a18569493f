"""``plan_batch`` on rollout-shaped lengths: its speed against one ``np.argsort`` of the same lengths, its balance
across ranks, and the trainers' own batching on the same data (verl, slime, TRL).

Lengths: a log-normal prompt (median 400, sigma 0.6) plus a log-normal response (median 1,500,
sigma 1.0), clipped to 16..32768: 10k and 100k of them (the originals at 2k and 4k at
``--scale small``, 10k and 100k at ``full``); the cap is 32,768 tokens a micro-batch, W = 8 and 64
ranks, the cost of a sequence of s tokens ``6144*s + s^2``. Per method: the time of one call (best
of a few), micro-batches against the bound ``ceil(sum / cap)``, how many are over the cap, whether
every rank gets the same count, and the busiest rank over the mean in cost and in tokens.

- sortpack: ``plan_batch(lengths, world_size=W, max_tokens=32768, cost_coeff=6144)``; its time
  beside one ``np.argsort`` of the same lengths in this process (the target: at most 6x, and 20 ms
  at 100k);
- verl 0.9.1 (``trainer_baselines``, re-implemented): the trainer's Karmarkar-Karp of the batch
  into W equal parts, then rank 0's ``rearrange_micro_batches`` (every rank makes the same call at
  once: its time is the step's); "before PR #7553" is the same without the repartition that keeps
  parts under the cap. Over-cap counts are rank 0's;
- slime 624b824 (``trainer_baselines``, re-implemented): the dynamic ``build_dp_schedule`` with
  ``balance_data``: first fit in rollout order, splits, Karmarkar-Karp with equal counts;
- sortpack's adapters of both (``sortpack.batch.verl``, ``sortpack.batch.slime``): the same
  signatures, planned by ``plan_batch``;
- TRL: ``trl.pack_dataset(strategy="bfd")`` (installed) against ``sortpack.batch.trl.PackingCollator.rows``
  on the same lengths: rows of the cap, no ranks.

Registered in ``suite.py`` as ``plan_batch``: ``python -m benchmarks --only plan_batch [--scale small|full]``,
or ``python -m benchmarks.bench_plan_batch``.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np

from . import trainer_baselines as tb
from .report import Row, Section, print_script_results, script_log, secs

CAP = 32768
C = 6144.0
WORLDS = (8, 64)
SIZES = {"small": ((10_000, 2_000), (100_000, 4_000)), "full": ((10_000, 10_000), (100_000, 100_000))}


def rollout_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Return n rollout lengths: a log-normal prompt (median 400) plus a log-normal response (median 1,500)."""
    rng = np.random.default_rng(seed)
    prompt, response = rng.lognormal(np.log(400), 0.6, n), rng.lognormal(np.log(1500), 1.0, n)
    return np.clip(np.rint(prompt + response), 16, CAP).astype(np.int64)


def best_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Return (the fastest of ``repeats`` calls of ``fn``, the last result)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def figures(lengths: np.ndarray, ranks: list[list[list[int]]], per_rank_count: list[int] | None = None) -> dict:
    """Return the figures of a deal: ``ranks[r]`` the micro-batches of rank r (each a list of indices).

    With ``per_rank_count`` (verl: only rank 0's micro-batches are made, the other ranks hold one list of
    their samples each) the counts are those and micro-batches over the cap are counted on rank 0 alone.
    """
    s = lengths.astype(np.float64)
    cost = np.array([sum(C * s[i] + s[i] * s[i] for mb in r for i in mb) for r in ranks])
    tokens = np.array([sum(int(lengths[i]) for mb in r for i in mb) for r in ranks])
    counts = per_rank_count or [len(r) for r in ranks]
    mbs = ranks[0] if per_rank_count else [mb for r in ranks for mb in r]
    return {"microbatches": sum(counts), "bound": -(-int(lengths.sum()) // CAP),
            "over": sum(int(lengths[list(mb)].sum()) > CAP for mb in mbs), "of": len(mbs),
            "equal": len(set(counts)) == 1 and min(counts) > 0 and all(len(mb) for mb in mbs),
            "cost": cost.max() / cost.mean(), "tokens": tokens.max() / tokens.mean()}


def _verl(lengths: np.ndarray, world: int, repartition: bool) -> tuple[float, dict]:
    """Return (seconds, figures) of verl's batching: the trainer's equal split, then rank 0's micro-batches."""
    values = lengths[:len(lengths) // world * world].tolist()  # verl's trainer splits a batch that divides by W
    t = time.perf_counter()
    parts = tb.verl_karmarkar_karp(values, world, equal_size=True)
    local = sorted(parts[0])
    mbs = tb.verl_micro_batches([values[i] for i in local], CAP, repartition)
    seconds = time.perf_counter() - t
    rank0 = [[local[i] for i in mb] for mb in mbs]
    ranks = [rank0] + [[sorted(p)] for p in parts[1:]]  # a rank's cost and tokens are its part's
    return seconds, figures(lengths, ranks, [len(mbs)] * world)


def _slime(lengths: np.ndarray, world: int) -> tuple[float, dict]:
    t = time.perf_counter()
    ranks = tb.slime_schedule(lengths.tolist(), world, CAP, C)
    return time.perf_counter() - t, figures(lengths, ranks)


def _ours(lengths: np.ndarray, world: int, repeats: int) -> tuple[float, float, dict]:
    """Return (seconds of plan_batch, seconds of one np.argsort, figures)."""
    from sortpack import plan_batch

    argsort, _ = best_time(lambda: np.argsort(lengths), repeats)
    seconds, plan = best_time(lambda: plan_batch(lengths, world_size=world, max_tokens=CAP, cost_coeff=C), repeats)
    ranks = [[mb.tolist() for mb in plan.rank(r)] for r in range(world)]
    return seconds, argsort, figures(lengths, ranks)


def _adapters(lengths: np.ndarray, world: int, repeats: int) -> dict:
    """Return {name: (seconds, figures)} of sortpack's verl and slime adapters on the batch."""
    from types import SimpleNamespace

    from sortpack.batch.slime import build_dp_schedule
    from sortpack.batch.verl import get_seqlen_balanced_partitions, rearrange_micro_batches

    def verl() -> list[list[list[int]]]:
        # verl's trainer splits a batch whose size divides by W: the last n mod W lengths wait for the next
        parts = get_seqlen_balanced_partitions(lengths[:len(lengths) // world * world].tolist(), world, True)
        local = parts[0]
        # a (samples, 1) "mask" whose rows sum to the lengths: what the adapter reads, without a (samples, 32k) array
        _, mbs = rearrange_micro_batches({"input_ids": lengths[local], "attention_mask": lengths[local][:, None]}, CAP)
        return [[[local[i] for i in mb] for mb in mbs]] + [[p] for p in parts[1:]]

    args = SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=CAP, hidden_size=C / 6)
    config = {"dp_size": world, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}

    def slime() -> list[list[list[int]]]:
        parts, micro, _, _ = build_dp_schedule(args, config, lengths.tolist(), global_batch_size=len(lengths),
                                               rollout_indices=list(range(len(lengths))))
        return [[[parts[r][i] for i in mb] for mb in micro[r]] for r in range(world)]

    out = {}
    for name, fn in (("sortpack's verl adapter", verl), ("sortpack's slime adapter", slime)):
        seconds, ranks = best_time(fn, repeats)
        counts = None if name.endswith("slime adapter") else [len(ranks[0])] * world
        out[name] = (seconds, figures(lengths, ranks, counts))
    return out


def _trl(lengths: np.ndarray, repeats: int) -> dict:
    """Return {name: (seconds, rows, over)} of TRL's pack_dataset and sortpack's PackingCollator on the lengths."""
    from sortpack.batch.trl import PackingCollator

    out = {}
    seconds, rows = best_time(lambda: PackingCollator(CAP).rows(lengths), repeats)
    out["sortpack PackingCollator"] = (seconds, len(rows), sum(int(lengths[r].sum()) > CAP for r in rows))
    try:
        import datasets
        from trl import pack_dataset
    except ImportError:
        return out
    datasets.disable_progress_bars()
    Dataset = datasets.Dataset
    data = Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
    seconds, packed = best_time(lambda: pack_dataset(data, CAP, strategy="bfd"), 1)
    sizes = [len(x) for x in packed["input_ids"]]
    out["TRL pack_dataset(bfd)"] = (seconds, len(sizes), sum(s > CAP for s in sizes))
    return out


# verl's rearrange_micro_batches is a pure-Python Karmarkar-Karp into ~samples / 11 parts, redone with one more
# part until none is over the cap: past this many samples a rank it takes minutes a call, and is not run
VERL_MOST = 5_000


def _originals(n: int, world: int, log: Callable[[str], None]) -> list[list[str]]:
    """Return the table rows of verl's and slime's batching (re-implemented) of n lengths for ``world`` ranks."""
    lengths = rollout_lengths(n)
    log(f"the trainers' batching of {n:,} lengths, W={world}")
    out = []
    for name, repartition in (("verl 0.9.1 (re-implemented)", True), ("verl before PR #7553", False)):
        if n // world > VERL_MOST:
            out.append([f"{n:,}", str(world), name, f"not run (> {VERL_MOST:,} samples a rank: minutes a call)",
                        "", "", "", "", ""])
            continue
        out.append(_cells(n, world, name, *_verl(lengths, world, repartition)))
    out.append(_cells(n, world, "slime 624b824 (re-implemented)", *_slime(lengths, world)))
    return out


HEADER = ["n", "W", "method", "time", "micro-batches (bound)", "over cap", "equal counts", "cost max/mean",
          "tokens max/mean"]


def _cells(n: int, world: int, name: str, seconds: float, f: dict) -> list[str]:
    return [f"{n:,}", str(world), name, secs(seconds), f"{f['microbatches']} ({f['bound']})",
            f"{f['over']} of {f['of']}", "yes" if f["equal"] else "no", f"{f['cost']:.6f}", f"{f['tokens']:.4f}"]


def measure(scale: str, log: Callable[[str], None]) -> tuple[list[Section], list[Row]]:
    """Return the benchmark's table and its goal rows (100k: cost <= 1.001, tokens <= 1.01, 20 ms, 6x argsort)."""
    section = Section(f"plan_batch on rollout lengths, cap {CAP:,}, cost C*s + s^2 (C = {C:g}), one call",
                      HEADER)
    rows: list[Row] = []
    repeats = 5
    for n, n_orig in SIZES[scale]:
        for world in WORLDS:
            lengths = rollout_lengths(n)
            seconds, argsort, f = _ours(lengths, world, repeats)
            section.rows.append(_cells(n, world, "sortpack plan_batch", seconds, f))
            target = n == 100_000 and world == 64
            rows.append(Row("plan_batch", f"{n:,} lengths, W={world}: one call", 1, secs(seconds),
                            f"np.argsort {secs(argsort)}", f"{seconds / argsort:.1f}× argsort",
                            "≤ 20 ms, ≤ 6× argsort" if target else "",
                            (seconds <= 0.020 and seconds <= 6 * argsort) if target else None,
                            f"cost {f['cost']:.6f}, tokens {f['tokens']:.4f}, {f['over']} over the cap"))
            if target:
                rows.append(Row("plan_batch", f"{n:,} lengths, W={world}: rank imbalance", 1,
                                f"cost {f['cost']:.6f}, tokens {f['tokens']:.4f}", "", "",
                                "cost ≤ 1.001, tokens ≤ 1.01", f["cost"] <= 1.001 and f["tokens"] <= 1.01))
            for name, (secs_a, fa) in _adapters(lengths, world, 2).items():
                section.rows.append(_cells(n, world, name, secs_a, fa))
            section.rows.extend(_originals(n_orig, world, log))
        lengths = rollout_lengths(n_orig)
        for name, (secs_t, count, over) in _trl(lengths, 2).items():
            section.rows.append([f"{n_orig:,}", "-", name, secs(secs_t), f"{count} rows", f"{over} of {count}", "-",
                                 "-", "-"])
    return [section], rows


def bench(ctx) -> list[Row]:
    """The suite's ``plan_batch`` benchmark: its table into the report, the goal rows back."""
    sections, rows = measure(ctx.scale_name, ctx.log)
    ctx.sections.extend(sections)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_plan_batch", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SIZES), default="small")
    args = ap.parse_args(argv)
    log = script_log("bench_plan_batch", args.scale)
    sections, rows = measure(args.scale, log)
    print_script_results(sections, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
