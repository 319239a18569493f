"""``PlanDataModule``: a real Lightning ``Trainer`` stops at step 3 on two devices and resumes on one and on three.

The oracle is what an uninterrupted run trains on: every micro-batch of the epoch exactly once
(the repeats that fill the last step aside), so every sample id of the plan once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")

from sortpack.lightning import PlanDataModule  # noqa: E402
from sortpack.reader import PackedIndex, PackedSampler  # noqa: E402

from reader_fixtures import pipeline_index  # noqa: E402
from support import ROOT  # noqa: E402

WORKER = ROOT / "tests" / "train" / "lightning_worker.py"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """An index of 23 micro-batches (92 texts, at most 4 each), written by the real pipeline."""
    lengths = np.random.default_rng(0).integers(1, 200, size=92)
    return pipeline_index(tmp_path_factory.mktemp("lightning") / "ix", lengths, max_tokens=1000, max_samples=4)


def fit(plan, devices: int, mode: str, ckpt, out) -> list:
    """Run the worker's Trainer on ``devices`` CPU devices; return every rank's trained micro-batches."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    done = subprocess.run([sys.executable, WORKER, plan, str(devices), mode, ckpt, out], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [mb for r in range(devices) for mb in json.loads(out.with_name(f"{out.name}-rank{r}.json").read_text())]


def epoch0(mbs) -> Counter:
    """Return how often each micro-batch of epoch 0 was trained on (the repeats that fill a step aside)."""
    return Counter(mb for mb, epoch, repeat, _ in mbs if epoch == 0 and not repeat)


@pytest.mark.slow
def test_a_trainer_stopped_at_two_devices_resumes_on_one_and_three(plan, tmp_path):
    index = PackedIndex(plan)
    everything = Counter(range(index.num_microbatches))
    ckpt = tmp_path / "step3.ckpt"
    first = fit(plan, 2, "stop", ckpt, tmp_path / "first")
    assert len(first) == 3 * 2 * 2  # 3 steps of 2 micro-batches on each of 2 ranks
    for devices in (1, 3):
        rest = fit(plan, devices, "resume", ckpt, tmp_path / f"rest{devices}")
        # an uninterrupted run trains every micro-batch of the epoch once: the plan's sample ids, each once
        assert epoch0(first + rest) == everything, devices
        ids = sorted(i for mb, epoch, repeat, got in first + rest if not repeat for i in got)
        assert ids == sorted(index.all_sample_ids().tolist())


def test_the_module_refuses_what_the_trainer_decides_and_a_state_of_another_plan(plan, tmp_path):
    with pytest.raises(ValueError, match="world_size come.* from the Trainer"):
        PlanDataModule(plan, world_size=2)
    dm = PlanDataModule(plan)
    assert dm.state_dict() == {}
    other = pipeline_index(tmp_path / "other", np.arange(1, 40), max_tokens=100)
    with pytest.raises(ValueError, match="belongs to another index"):
        dm.load_state_dict({"sampler": PackedSampler(other, rank=0, world_size=1).state_dict()})
    with pytest.raises(ValueError, match="expected"):
        dm.load_state_dict({"position": 3})
    place = PackedSampler(plan, rank=0, world_size=2).state_dict()
    dm.load_state_dict({"sampler": place})
    assert dm.state_dict() == {"sampler": place}  # kept for the sampler train_dataloader makes
    with pytest.raises(RuntimeError, match="attach the module to a Trainer"):
        dm.train_dataloader()
    dm.setup("validate")  # only fitting needs the sampler
    assert dm.sampler is None
