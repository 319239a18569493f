"""The README's stored-data training loop, run as written: a fresh run, and one interrupted in epoch 1 and resumed."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
import sortpack.torch
from sortpack.reader import step_info

from support import ROOT, make_tokenizer, run_sortpack, write_text_parquet

pytestmark = pytest.mark.torch
BASE = sortpack.torch.PackedBatchSampler


def stored_loop() -> str:
    """Return the README's code block that trains from stored data (after "Train from `plan/` alone")."""
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("Train from `plan/` alone"):]
    return re.search(r"```python\n(.*?)```", after, flags=re.DOTALL).group(1)


class Interrupted(Exception):
    pass


def recording_sampler(log: list, states: list, stop_after: int | None):
    """Return a PackedBatchSampler class that logs every consumed micro-batch and stops after ``stop_after``."""
    class Recording(BASE):
        def consume(self, batch):
            super().consume(batch)
            info = step_info(batch)  # PlanLoader reports the MicroBatch it handed over
            log.append((info["epoch"], [int(i) for i in batch]))
            states.append(self.state_dict())
            if stop_after is not None and len(log) == stop_after:
                raise Interrupted
    return Recording


def run_loop(monkeypatch, cwd: Path, checkpoint, stop_after=None) -> tuple[list, list]:
    """Exec the README loop in ``cwd`` (holding plan/) for E = 2 epochs; return the consumed batches and states."""
    log: list = []
    states: list = []
    monkeypatch.chdir(cwd)
    ckpt = cwd / "ckpt.pt"
    if checkpoint is None:
        ckpt.unlink(missing_ok=True)
    else:
        import torch

        torch.save(checkpoint, ckpt)
    monkeypatch.setattr(sortpack.torch, "PackedBatchSampler", recording_sampler(log, states, stop_after))
    try:
        exec(stored_loop(), {})
    except Interrupted:
        pass
    return log, states


def test_readme_stored_loop_resumes_in_the_right_epoch(tmp_path, monkeypatch):
    words = np.array(["hello", "world", "the", "quick", "brown", "fox"])
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=120)
    texts = [" ".join(words[rng.integers(0, len(words), n)]) for n in lengths]
    write_text_parquet(tmp_path / "data.parquet", lengths, extra={"text": texts})
    tok = make_tokenizer(tmp_path / "tok.json")
    run_sortpack(["run", tmp_path / "data.parquet", "-o", tmp_path / "plan", "--column", "text", "--size", "tokens",
                  "--tokenizer", tok, "--max-tokens", "200", "--store-tokens", "--quiet"])
    full, _ = run_loop(monkeypatch, tmp_path, None)
    per_epoch = len(full) // 2
    assert [e for e, _ in full] == [0] * per_epoch + [1] * per_epoch
    assert full[:per_epoch] != full[per_epoch:]  # shuffled anew each epoch
    stop = per_epoch + 2  # interrupted two steps into epoch 1
    first, states = run_loop(monkeypatch, tmp_path, None, stop_after=stop)
    rest, _ = run_loop(monkeypatch, tmp_path, {"sampler": states[-1]})
    assert first + rest == full  # resumed in epoch 1 at the next step, nothing repeated or skipped
