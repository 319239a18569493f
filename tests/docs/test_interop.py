"""docs/interop.md and the Megatron recipe of docs/training.md run as written: a byte-level corpus made with
megatron-core's builder, planned index-only, exported, and trained on through megatron-core's IndexedDataset."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_files import megatron_core
from support import ROOT, run_gloo_ranks

pytestmark = pytest.mark.torch
RECIPE = ROOT / "examples" / "recipes" / "megatron_indexed.py"
SECTION = "## Megatron-LM's `IndexedDataset`"


def _section() -> str:
    doc = (ROOT / "docs" / "training.md").read_text()
    start = doc.index(SECTION)
    return doc[start:doc.index("\n## ", start + 1)]


def test_interop_keeps_the_sections_of_the_doors():
    # the loader doors and the attention metadata are documented on this page too
    doc = (ROOT / "docs" / "interop.md").read_text()
    assert "\n## Loader doors\n" in doc and "\n## Attention metadata\n" in doc


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The docs' commands over a small text dataset: the corpus (the docs' Python), the plan and the export."""
    megatron_core()
    sys.path.insert(0, str(Path(__file__).parent))
    from test_recipes import write_docs_data

    base = tmp_path_factory.mktemp("interop")
    write_docs_data(base / "data")
    section = _section()
    code = re.search(r"```python\n(import numpy.*?)```", section, flags=re.DOTALL).group(1)
    subprocess.run([sys.executable, "-c", code], cwd=str(base), check=True, timeout=240,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    for line in re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL).group(1).splitlines():
        args = shlex.split(line.split("#")[0])
        if args[:1] == ["sortpack"]:  # as written, in the directory the corpus was made in
            subprocess.run([sys.executable, "-m", "sortpack", *args[1:]], cwd=str(base), check=True, timeout=240,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    return base


def _steps(out: str) -> list[tuple[int, int, int]]:
    return [tuple(map(int, m)) for m in re.findall(r"step (\d+) samples (\d+) tokens (\d+)", out)]


def _expected(base: Path, world: int, rank: int, steps: int, grad_accum: int = 2) -> list[tuple[int, int, int]]:
    from sortpack.reader import PackedIndex

    index = PackedIndex(base / "megatron_plan")
    ns, tokens = index["num_samples"], index["tokens"]
    out = []
    for s in range(min(steps, len(ns) // (world * grad_accum))):  # whole steps only, as the recipe deals them
        ks = [s * world * grad_accum + a * world + rank for a in range(grad_accum)]
        out.append((s, int(sum(ns[k] for k in ks)), int(sum(tokens[k] for k in ks))))
    return out


@pytest.mark.slow
def test_the_recipe_trains_on_the_plan_s_micro_batches(exported):
    mc = megatron_core()
    from sortpack.reader import PackedIndex

    ds = mc.IndexedDataset(str(exported / "export" / "plan"))
    assert len(ds.document_indices) - 1 == len(PackedIndex(exported / "megatron_plan"))
    proc = subprocess.run([sys.executable, str(RECIPE), str(exported / "export" / "plan"), "--steps", "3"],
                          capture_output=True, text=True, timeout=240, cwd=str(ROOT),
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _steps(proc.stdout) == _expected(exported, 1, 0, 3) and "nan" not in proc.stdout
    losses = [float(x) for x in re.findall(r"loss (\S+)", proc.stdout)]
    assert all(np.isfinite(losses))


@pytest.mark.slow
def test_the_recipe_on_two_ranks_deals_the_plan_as_the_sampler(exported):
    outs = run_gloo_ranks([RECIPE, exported / "export" / "plan", "--steps", "2"], ranks=2)
    for rank, out in enumerate(outs):
        assert _steps(out) == _expected(exported, 2, rank, 2) and _steps(out), out
