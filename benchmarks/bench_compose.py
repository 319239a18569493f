"""The constants of rows composed by their targets (``sortpack/stages/pack/compose.py``), each against its neighbours.

Generated chats (``bench_sft.make_chats``, as ``balance_targets``: 100k in rows of 4096 at
``--scale full``, 20k in rows of 1024 at small) are measured and sorted once; the sorted samples
are then packed in process (``pack_samples``, ``--rows --oversize skip --balance targets``) with
every constant at the value ``compose.py`` ships, and once more per constant with a smaller and
a larger value, the others at theirs. Each row: the targets imbalance of the steps at W = 64 and
W = 8 (p99, max, weighted; A = 1, the short tail repeating the start as the reader deals it) and
the pack's time. A constant's row shows what its value gains over the smaller one and what the
larger one would add (or cost): that row is what justifies it. The small scale sweeps the first
constant only.

Registered in ``suite.py`` as ``compose``: ``python -m benchmarks --only compose [--scale small|full]``.
"""
from __future__ import annotations

import contextlib
import shutil
import time
from unittest import mock

import numpy as np

from . import data
from .bench_balance import WORLDS, dealt
from .report import Row, Section, secs

# each constant of compose.py, with the smaller and the larger value it is measured against
SWEEP = {"HEAVY": (1.05, 1.2), "PAIR_PLACES": (12, 48), "PAIR_WIDTH": (16, 256), "PAIR_SLACK": (0, 16),
         "PAIR_ROUNDS": (16, 256), "SUBSET_PARTNERS": (64, 1024), "SUBSET_PLACES": (8, 24), "SUBSET_ROUNDS": (2, 32)}


def _figures(targets: np.ndarray) -> dict:
    """Return {W: (p99, max, weighted)} of the steps' max/mean targets over ranks."""
    out = {}
    for w in WORLDS:
        costs = dealt(targets.astype(np.float64), w)
        mean, top = costs.mean(axis=1), costs.max(axis=1)
        ratio = np.where(mean > 0, top / np.where(mean > 0, mean, 1), 1.0)
        out[w] = (float(np.quantile(ratio, 0.99)), float(ratio.max()), float(top.sum() / mean.sum()))
    return out


def _pack(samples, row: int, changes: dict) -> tuple[dict, float]:
    """Return (the figures, the pack's seconds) of ``samples`` packed with compose's constants ``changes``."""
    from sortpack.parallel import SerialComm
    from sortpack.stages.pack import PackOptions, compose, pack_samples

    with mock.patch.multiple(compose, **changes) if changes else contextlib.nullcontext():
        t0 = time.perf_counter()
        mbs = pack_samples(SerialComm(), samples, PackOptions(rows=row, oversize="skip", balance="targets"))
        wall = time.perf_counter() - t0
    return _figures(mbs.columns["targets"]), wall


def bench(ctx) -> list[Row]:
    """Return the rows: the W = 64 p99 targets imbalance at the shipped constants; a section with every neighbour."""
    from sortpack.parallel import SerialComm
    from sortpack.stages.pack import compose
    from sortpack.write.sample_dirs import read_samples

    from .runner import missing_modules, sortpack_cli
    from .sft_data import make_chats, make_tokenizer

    missing = missing_modules("tokenizers", "jinja2")
    if missing:
        return [Row("compose", "compose constants", 1, "skipped", note=f"needs {', '.join(missing)}")]
    full = ctx.scale_name == "full"
    n, row = (100_000, 4096) if full else (20_000, 1024)
    work = data.work_dir("compose")
    tok, config = make_tokenizer(work / "tokenizer")
    ctx.log(f"generating {n} chats, measuring and sorting them once")
    chats = make_chats(work / f"chats-{n}", n, seed=1, files=4 if full else 2)
    sortpack_cli(["run", *map(str, chats), "-o", str(work / "first"), "--chat-template", str(config), "--tokenizer",
                  str(tok), "--rows", str(row), "--oversize", "skip", "--keep-intermediate", "--overwrite", "--quiet"],
                 ctx.scale.timeout, 1)
    samples, _ = read_samples(SerialComm(), str(work / "first.sorted"), "sorted")
    ctx.log("packing with the shipped constants")
    shipped, wall = _pack(samples, row, {})
    section = Section(f"compose constants, {n // 1000}k generated chats, rows of {row}, --balance targets, A = 1",
                      ["constant", "value", *(f"W={w} p99 / max / weighted" for w in sorted(WORLDS, reverse=True)),
                       "pack time"])

    def line(name: str, value, figures: dict, seconds: float) -> list[str]:
        return [name, str(value), *(f"{figures[w][0]:.3f} / {figures[w][1]:.3f} / {figures[w][2]:.4f}"
                                    for w in sorted(WORLDS, reverse=True)), secs(seconds)]

    section.rows.append(line("(all shipped)", "", shipped, wall))
    # the small scale (CI's smoke run) sweeps one constant: the same code for each
    for name, (lower, higher) in list(SWEEP.items())[:None if full else 1]:
        for value in (lower, higher):
            ctx.log(f"{name} = {value}")
            figures, seconds = _pack(samples, row, {name: value})
            section.rows.append(line(name, f"{value} (ships {getattr(compose, name)})", figures, seconds))
    ctx.sections.append(section)
    shutil.rmtree(work / "first", ignore_errors=True)
    shutil.rmtree(work / "first.metrics", ignore_errors=True)
    shutil.rmtree(work / "first.sorted", ignore_errors=True)
    return [Row("compose", f"--rows {row} --balance targets at the shipped constants, W=64: p99 targets imbalance",
                1, f"{shipped[64][0]:.3f}", note=f"max {shipped[64][1]:.3f}, weighted {shipped[64][2]:.4f}; pack "
                f"{secs(wall)}; each constant against a smaller and a larger value in the section below")]
