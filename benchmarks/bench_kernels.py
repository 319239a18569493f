"""Quick timings of sortpack.kernels: python benchmarks/bench_kernels.py [--quick].

Prints the best of a few runs (warm allocator: the first touch of fresh pages is a
one-off cost of the process, not of the kernel).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from sortpack import kernels as K

REPEAT = 5


def best_ms(fn, repeat: int = 0) -> float:
    """Return the fastest of ``repeat`` calls of fn, in milliseconds of wall time.

    On a shared machine also compare with ``--cpu`` (thread CPU time, which leaves out the
    time the process waited for a core).
    """
    best = float("inf")
    clock = time.thread_time if CPU else time.perf_counter
    for _ in range(repeat or REPEAT):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best * 1e3


CPU = False


def lognormal_sizes(n: int, rng, median: float = 300.0, sigma: float = 1.0, cap: int = 8192) -> np.ndarray:
    """Return n sizes drawn log-normal with the given median, clipped to [1, cap]."""
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 1, cap).astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1/10 of the sizes")
    ap.add_argument("--repeat", type=int, default=5, help="runs per timing (the best is kept)")
    ap.add_argument("--cpu", action="store_true", help="time thread CPU time instead of wall time")
    args = ap.parse_args()
    global REPEAT, CPU
    REPEAT, CPU = args.repeat, args.cpu
    scale = 10 if args.quick else 1
    rng = np.random.default_rng(0)
    print(f"backend: {K.backend()}")

    n = 10_000_000 // scale
    sizes = np.sort(rng.integers(128, 4096, n))
    for budget in ("padded", "tokens", "quadratic"):
        q = 4096.0 if budget == "quadratic" else 1.0
        ms = best_ms(lambda: K.greedy_pack(sizes, 500_000, budget, quadratic_scale=q))
        print(f"greedy_pack {budget:9s} n={n:,} ascending: {ms:7.1f} ms")
    ms = best_ms(lambda: K.greedy_pack(sizes, 500_000, "padded", batch_multiple=8, shapes=[512, 1024, 2048, 4096]))
    print(f"greedy_pack padded M=8 shapes n={n:,}:   {ms:7.1f} ms")
    shuffled = rng.permutation(sizes)
    ms = best_ms(lambda: K.greedy_pack(shuffled, 500_000))
    print(f"greedy_pack padded    n={n:,} random:    {ms:7.1f} ms")

    half = 5_000_000 // scale
    for k in (2, 3, 8, 64, 1024):
        lens = np.full(k, 2 * half // k)
        lens[-1] += 2 * half - lens.sum()
        offsets = np.concatenate([[0], np.cumsum(lens)])
        keys = np.concatenate([np.sort(rng.integers(0, 2**63, m, dtype=np.uint64)) for m in lens])
        ms = best_ms(lambda: K.merge_sorted_runs(keys, offsets))
        lo = rng.integers(0, 2**63, len(keys), dtype=np.uint64)
        hi = keys >> np.uint64(40)  # many ties on hi, so lo decides often
        for r in range(k):
            s = slice(offsets[r], offsets[r + 1])
            o = np.lexsort((lo[s], hi[s]))
            hi[s], lo[s] = hi[s][o], lo[s][o]
        ms2 = best_ms(lambda: K.merge_sorted_runs2(hi, lo, offsets))
        ref = best_ms(lambda: np.argsort(keys, kind="stable"), repeat=2)
        print(f"merge k={k:5d} n={2 * half:,}: merge_sorted_runs {ms:7.1f} ms, "
              f"merge_sorted_runs2 {ms2:7.1f} ms (np.argsort stable {ref:.0f} ms)")

    n = 1_000_000 // scale
    sizes = lognormal_sizes(n, rng)
    for label, s in (("random order", sizes), ("sorted", np.sort(sizes))):
        for window in (K.DEFAULT_ROW_WINDOW, 0):
            order, splits = K.pack_rows_windows(s, 8192, 0, window)
            fill = s.sum() / ((len(splits) - 1) * 8192)
            ms = best_ms(lambda: K.pack_rows_windows(s, 8192, 0, window))
            print(f"pack_rows {label:12s} n={n:,} window={window or 'all':>6}: "
                  f"fill {100 * fill:.3f}%  rows {len(splits) - 1:,}  {ms:6.1f} ms")


if __name__ == "__main__":
    main()
