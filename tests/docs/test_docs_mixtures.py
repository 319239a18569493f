"""docs/mixtures.md: its worked example runs and prints the figures the page shows."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from support import ROOT, run_sortpack

DOC = ROOT / "docs" / "mixtures.md"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


@pytest.mark.slow
def test_the_worked_example_prints_the_documented_figures(tmp_path):
    text = DOC.read_text()
    example = text.split("## Worked example", 1)[1]
    script = _blocks(example, "python")[0]
    commands = _blocks(example, "sh")[0].strip().splitlines()
    expected = _blocks(example, "text")[0].strip().splitlines()
    (tmp_path / "make_data.py").write_text(script)
    subprocess.run([sys.executable, "make_data.py"], cwd=tmp_path, check=True)
    output = ""
    for line in commands:
        args = line.split()
        assert args[0] == "sortpack"
        args = [str(tmp_path / a) if a in ("mix.json", "plan") else a for a in args[1:]]
        output = run_sortpack(args).stdout
    got = output[output.index("mixture "):].strip().splitlines()
    assert got == expected
