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


def encode_batch_fast_baseline(tokenizer, texts: list[str]) -> np.ndarray:
    """Return token counts of ``texts`` from one ``Tokenizer.encode_batch_fast`` call (no offsets computed)."""
    return np.fromiter((len(e.ids) for e in tokenizer.encode_batch_fast(texts)), np.int64, len(texts))
