"""The ``Examples`` of the ten door names run as written (doctest), on a plan the real CLI wrote.

The ten names a training script meets first, from ``sortpack.reader`` and ``sortpack.torch``:
``PackedIndex``, ``PackedSampler`` (``PackedBatchSampler`` is the same class), ``SourceDataset``,
``PlanLoader``, ``Prefetched``, ``EpochPlan``, ``step_positions``, ``lr_scale``,
``VariableBatchSizeLR`` and ``KeyedPermutation``; and what a training step touches: ``MicroBatch``,
``pad_collate``, ``step_loss``, and ``PlanNode`` (torchdata's door). Their examples read ``plan/``: 16
texts of 1 to 16 characters, ``sortpack run data/ -o plan/ --column text --max-tokens 32 --store text``.
"""
from __future__ import annotations

import doctest

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sortpack.reader
import sortpack.torch

from support import run_sortpack

DOORS = {
    "PackedIndex": sortpack.reader, "PackedSampler": sortpack.reader, "SourceDataset": sortpack.reader,
    "PlanLoader": sortpack.torch, "Prefetched": sortpack.reader, "EpochPlan": sortpack.reader,
    "step_positions": sortpack.reader, "lr_scale": sortpack.reader, "VariableBatchSizeLR": sortpack.torch,
    "KeyedPermutation": sortpack.reader,
}
# what a training step touches beside the doors: the micro-batch, its collate, its loss
STEP = {"MicroBatch": sortpack.reader, "pad_collate": sortpack.torch, "step_loss": sortpack.torch,
        "PlanNode": sortpack.torch}
EXAMPLES = {**DOORS, **STEP}
NEEDS_TORCH = {"PlanLoader", "VariableBatchSizeLR", "pad_collate", "step_loss", "PlanNode"}


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    """Return a directory holding ``data/`` and the ``plan/`` the examples read."""
    root = tmp_path_factory.mktemp("doors")
    (root / "data").mkdir()
    lengths = [(i * 7) % 16 + 1 for i in range(16)]  # 1 to 16, shuffled
    pq.write_table(pa.table({"text": ["abcdefghijklmnop"[:n] for n in lengths]}), root / "data" / "part-0.parquet")
    run_sortpack(["run", root / "data", "-o", root / "plan", "--column", "text", "--max-tokens", "32",
                  "--store", "text", "--quiet"])
    return root


def test_the_door_names_and_a_steps_names_each_carry_examples():
    assert len(DOORS) == 10
    for name, door in EXAMPLES.items():
        doc = getattr(door, name).__doc__ or ""
        assert "\n    Examples\n    --------\n" in doc and ">>> " in doc, name
    assert sortpack.torch.PackedBatchSampler is sortpack.reader.PackedSampler  # shares the examples


# torch's import and first optimizer take over a second: those two are slow (the quick loop skips them)
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.torch, pytest.mark.slow]) if n in NEEDS_TORCH
                                  else n for n in sorted(EXAMPLES)])
def test_the_examples_run_as_written(name, plan_dir, monkeypatch):
    if name in NEEDS_TORCH:
        pytest.importorskip("torch" if name != "PlanNode" else "torchdata")
    monkeypatch.chdir(plan_dir)
    obj = getattr(EXAMPLES[name], name)
    tests = [t for t in doctest.DocTestFinder(recurse=False).find(obj, name) if t.examples]
    assert tests, f"{name}: no doctest examples"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
