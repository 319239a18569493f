"""The two documented doors of the reader, ``sortpack.reader`` and ``sortpack.torch``."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support import ROOT

# an import of a reading or training class from anywhere but the two doors
BACK_DOORS = re.compile(r"^\s*(?:from|import)\s+(sortpack\.(?:dataset|reader\.\w+|train)\b)", re.M)


def test_the_framework_free_door_gives_source_dataset_without_loading_torch():
    code = ("import sys; from sortpack.reader import PackedSampler, SourceDataset; "
            "from sortpack.reader.dataset import SourceDataset as home; assert SourceDataset is home; "
            "sys.exit('torch loaded' if 'torch' in sys.modules else 0)")
    subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_sortpack_dataset_still_imports_with_a_warning_naming_the_new_door():
    import sortpack.reader
    import sortpack.torch

    with pytest.warns(DeprecationWarning, match="write `from sortpack.reader import SourceDataset`"):
        from sortpack.dataset import SourceDataset
    assert SourceDataset is sortpack.reader.SourceDataset is sortpack.torch.SourceDataset
    import sortpack.dataset

    with pytest.raises(AttributeError, match="no attribute 'PackedSampler'"):
        sortpack.dataset.PackedSampler  # noqa: B018  # the alias is SourceDataset's only


def test_readme_docs_and_examples_import_only_through_the_two_doors():
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.py"))]
    found = [f"{p.relative_to(ROOT)}: {m.group(1)}" for p in texts for m in BACK_DOORS.finditer(p.read_text())]
    assert found == [], "import these from sortpack.reader or sortpack.torch"
