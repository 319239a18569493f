"""The README's first screen runs as written: the example dataset, the 2-rank run, then the training block."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from support import ROOT, run_sortpack

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.mpi, pytest.mark.slow]
README = (ROOT / "README.md").read_text()


def _block(after: str, lang: str) -> str:
    """Return the first ``lang`` code block of the README after the heading ``after``."""
    rest = README[README.index(after):]
    return re.search(rf"```{lang}\n(.*?)```", rest, flags=re.DOTALL).group(1)


def _here(args: list[str], cwd) -> list[str]:
    """Return ``args`` with the README's relative directories (``example/``, ``plan/``) made absolute in ``cwd``."""
    return [str(cwd / a) if a.endswith("/") and not a.startswith("-") else a for a in args]


def test_the_first_screen_reaches_a_trained_batch(tmp_path, monkeypatch, capsys):
    commands = [line for line in _block("## Two commands on a fresh machine", "bash").splitlines()
                if line.strip() and not line.startswith("pip ")]
    assert [c.split()[0] for c in commands] == ["python", "mpiexec", "sortpack"]
    make = shlex.split(commands[0])
    subprocess.run([sys.executable, str(ROOT / make[1]), *make[2:]], cwd=tmp_path, check=True, timeout=120,
                   capture_output=True)
    run = shlex.split(commands[1])
    ranks = int(run[run.index("-n") + 1])
    run_sortpack(_here(run[run.index("run"):], tmp_path), ranks=ranks, timeout=300)
    run_sortpack(_here(shlex.split(commands[2])[1:], tmp_path), timeout=120)

    monkeypatch.chdir(tmp_path)
    exec(compile(_block("## Train on the plan", "python"), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == ["0", "1", "2"]  # three steps trained
    for line in printed:
        tokens = int(line.split()[-1])
        assert 0 < tokens <= 16384  # a micro-batch under the plan's budget of characters
