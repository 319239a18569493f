"""Baselines the figures are compared against, written from their published descriptions.

Nothing here imports sortpack: each baseline is what a user would write without it.
"""
from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np

PUBLISHED_SAMPLES = 100  # regular samples per rank in the published sample sort


def published_sample_sort(comm, records: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Return this rank's range of (key, id) records sorted over ``comm`` (an mpi4py communicator).

    The approach commonly published for curriculum learning: Python-list sorts, 100 regular
    samples per rank, all-gathered splitters, an all-to-all of counts, one Alltoallv of the
    records, and a second Python-list sort of what arrived.
    """
    from mpi4py import MPI

    p = comm.Get_size()
    local = sorted(records)
    n = len(local)
    take = min(PUBLISHED_SAMPLES, n)
    samples = [local[(i * n) // take][0] for i in range(take)]
    everyone = sorted(s for part in comm.allgather(samples) for s in part)
    splitters = [everyone[(i * len(everyone)) // p] for i in range(1, p)] if everyone else []
    keys = [k for k, _ in local]
    cuts = [0] + [bisect.bisect_right(keys, s) for s in splitters] + [n]
    send = np.diff(np.asarray(cuts, np.int64)) * 2  # two int64 per record
    recv = np.asarray(comm.alltoall(send.tolist()), np.int64)
    sbuf = np.asarray(local, dtype=np.int64).reshape(-1)
    rbuf = np.empty(int(recv.sum()), np.int64)
    sdispl = np.concatenate(([0], np.cumsum(send)[:-1]))
    rdispl = np.concatenate(([0], np.cumsum(recv)[:-1]))
    comm.Alltoallv([sbuf, (send, sdispl), MPI.INT64_T], [rbuf, (recv, rdispl), MPI.INT64_T])
    return sorted(map(tuple, rbuf.reshape(-1, 2).tolist()))


def local_sort_floor(keys: np.ndarray) -> np.ndarray:
    """Return ``np.sort`` of uint64 packed records in one process (the floor of any sort)."""
    return np.sort(keys)


def greedy_oracle(sizes, max_tokens: int, max_samples: int = 0) -> np.ndarray:
    """Return boundaries of the sequential padded greedy: a plain Python loop (the oracle).

    A sample joins the current micro-batch iff afterwards ``count * max_size <= max_tokens``
    (and ``count <= max_samples`` when > 0); a first sample always joins.
    """
    bounds = [0]
    count = top = 0
    for i, s in enumerate(np.asarray(sizes).tolist()):
        m = s if s > top else top
        if count and ((count + 1) * m > max_tokens or (max_samples and count + 1 > max_samples)):
            bounds.append(i)
            count, top = 1, s
        else:
            count, top = count + 1, m
    if count:
        bounds.append(len(sizes))
    return np.asarray(bounds, np.int64)


def greedy_tokens_oracle(sizes, max_tokens: int) -> np.ndarray:
    """Return boundaries of the sequential greedy under the tokens budget: a plain Python loop (its oracle).

    A sample joins the current micro-batch iff afterwards the samples' sum is at most ``max_tokens``;
    a first sample always joins.
    """
    bounds = [0]
    count = total = 0
    for i, s in enumerate(np.asarray(sizes).tolist()):
        if count and total + s > max_tokens:
            bounds.append(i)
            count, total = 1, s
        else:
            count, total = count + 1, total + s
    if count:
        bounds.append(len(sizes))
    return np.asarray(bounds, np.int64)


def greedy_numpy(sizes, max_tokens: int, max_samples: int = 0) -> np.ndarray:
    """Return the same boundaries as ``greedy_oracle``, one numpy pass per micro-batch.

    Within a window after a micro-batch's first sample, ``cummax * count`` is
    non-decreasing, so the micro-batch's length is one ``searchsorted``; the window
    doubles until it holds the cut. Works for any order, not only sorted sizes.
    """
    sizes = np.asarray(sizes, np.int64)
    n = len(sizes)
    counts = np.arange(1, n + 1, dtype=np.int64)
    bounds = [0]
    i, width = 0, 64
    while i < n:
        while True:
            win = sizes[i:i + width]
            cost = np.maximum.accumulate(win) * counts[:len(win)]
            c = max(1, int(np.searchsorted(cost, max_tokens, side="right")))
            if max_samples:
                c = min(c, max_samples)
            if c < len(win) or i + len(win) >= n:
                break
            width *= 2
        i += c
        bounds.append(i)
        # neighbouring micro-batches of sorted input have similar lengths
        width = max(64, 2 * c)
    return np.asarray(bounds, np.int64)


def io_floor(files: list[Path], column: str, out_path: Path) -> int:
    """Read ``column`` of Parquet ``files`` with pyarrow and write it as one Arrow IPC file; return rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.concat_tables(pq.read_table(f, columns=[column]) for f in files)
    with pa.OSFile(str(out_path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return table.num_rows


def utf8_length_baseline(path: Path, column: str) -> np.ndarray:
    """Return ``pyarrow.compute.utf8_length`` of a Parquet string column as int64 numpy."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    col = pq.read_table(path, columns=[column]).column(column)
    return pc.utf8_length(col).to_numpy().astype(np.int64, copy=False)


def encode_batch_baseline(tokenizer, texts: list[str]) -> np.ndarray:
    """Return token counts of ``texts`` from one ``Tokenizer.encode_batch`` call."""
    return np.fromiter((len(e.ids) for e in tokenizer.encode_batch(texts)), np.int64, len(texts))


def _ffd(sizes: np.ndarray, bins: int, row_len: int) -> list[list[int]] | None:
    """Return first-fit-decreasing of ``sizes`` (positions) into ``bins`` rows of ``row_len`` (None: no fit)."""
    room = np.full(bins, row_len, np.int64)
    members: list[list[int]] = [[] for _ in range(bins)]
    for i in np.argsort(-sizes, kind="stable").tolist():
        fit = np.flatnonzero(room >= sizes[i])
        if not fit.size:
            return None
        k = int(fit[0])
        room[k] -= sizes[i]
        members[k].append(i)
    return members


def multipack_rows(sizes: np.ndarray, row_len: int, world: int, seed: int = 0) -> list[list[np.ndarray]]:
    """Return the steps of a multipack sampler: per step, one row of sample indices for each of ``world`` ranks.

    As multipack (imoneoi/multipack_sampler, axolotl's MultipackBatchSampler) allocates: the
    samples in a seeded random order; each step takes the longest run of the next samples that
    first-fit-decreasing packs into ``world`` rows of ``row_len`` tokens (binary search on the
    run's length), and deals the rows round robin, one to each rank.
    """
    order = np.random.default_rng(seed).permutation(len(sizes))
    steps: list[list[np.ndarray]] = []
    a, n = 0, len(order)
    guess = max(1, world * row_len // max(int(sizes.mean()), 1))
    while a < n:
        lo, hi = 1, min(n - a, 2 * guess)  # lo always fits (a sample alone fits a row)
        while hi < n - a and _ffd(sizes[order[a:a + hi]], world, row_len) is not None:
            lo, hi = hi, min(n - a, 2 * hi)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _ffd(sizes[order[a:a + mid]], world, row_len) is not None:
                lo = mid
            else:
                hi = mid - 1
        rows = _ffd(sizes[order[a:a + lo]], world, row_len)
        assert rows is not None
        steps.append([order[a:a + lo][np.asarray(r, np.int64)] for r in rows])
        a, guess = a + lo, lo
    return steps


def karmarkar_karp(weights: list[float], k: int) -> list[list[int]]:
    """Return a partition of item indices into k parts of balanced weight sums (largest differencing method).

    As verl's ``get_seqlen_balanced_partitions`` (and slime's FLOPs balance) describe it: every
    item starts as a state of k parts (itself in one, the others empty); repeatedly the two
    states of largest spread are merged, the heaviest part of one with the lightest of the
    other, until one state is left.
    """
    import heapq

    heap: list = []
    for i, w in enumerate(weights):
        parts = [(0.0, [])] * (k - 1) + [(float(w), [i])]
        heapq.heappush(heap, (-float(w), i, parts))
    if not heap:
        return [[] for _ in range(k)]
    while len(heap) > 1:
        _, i, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        # a and b are sorted by weight ascending: a's heaviest with b's lightest
        merged = sorted(((wa + wb, la + lb) for (wa, la), (wb, lb) in zip(a, reversed(b))), key=lambda x: x[0])
        heapq.heappush(heap, (-(merged[-1][0] - merged[0][0]), i, merged))
    return [members for _, members in heap[0][2]]


def encode_batch_fast_baseline(tokenizer, texts: list[str]) -> np.ndarray:
    """Return token counts of ``texts`` from one ``Tokenizer.encode_batch_fast`` call (no offsets computed)."""
    return np.fromiter((len(e.ids) for e in tokenizer.encode_batch_fast(texts)), np.int64, len(texts))
