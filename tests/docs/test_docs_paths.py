"""The README and docs/*.md cite only what exists: every repository path, test name and pytest command."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from support import ROOT

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
# a repository path: starts at a top-level folder (not inside a longer path or a URL), optionally
# followed by ::test_name
PATH = re.compile(r"(?<![\w./~-])((?:sortpack|tests|examples|benchmarks)/[\w./*-]*)(?:::(\w+))?")
PYTEST = re.compile(r"python -m pytest[^`\n]*")


def _citations():
    """Yield (doc, line number, path, test name or None) for every repository path the docs cite."""
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in PATH.finditer(line):
                yield doc.relative_to(ROOT), n, m.group(1).rstrip("."), m.group(2)


def _commands():
    """Yield (doc, line number, the pytest arguments) of every ``python -m pytest ...`` the docs cite."""
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in PYTEST.finditer(line):
                yield doc.relative_to(ROOT), n, shlex.split(m.group(0))[3:]


def test_the_docs_cite_paths():
    # the scan itself works: the docs do cite paths and a test command (else this test checks nothing)
    cited = {str(p) for _, _, p, _ in _citations()}
    assert {"sortpack/torch.py", "tests/reliability", "examples/train_tiny.py"} <= cited
    assert len(list(_commands())) >= 2


def test_every_cited_path_exists():
    wrong = []
    for doc, line, path, test in _citations():
        hits = sorted(ROOT.glob(path.rstrip("/"))) if "*" in path else [ROOT / path.rstrip("/")]
        if not hits or not all(h.exists() for h in hits):
            wrong.append(f"{doc}:{line}: cites {path}, which does not exist")
        elif test and hits[0].is_file() and not re.search(rf"def {test}\b", hits[0].read_text(encoding="utf-8")):
            wrong.append(f"{doc}:{line}: cites {path}::{test}, but {path} has no test {test}")
    assert not wrong, "\n".join(wrong)


def _without_workers(args: list[str]) -> tuple[str, ...]:
    """Return a command's arguments without its ``-n N`` (pytest-xdist's workers collect what one process does)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-n", "--numprocesses"):
            skip = True
        elif not (a.startswith("--numprocesses=") or a.startswith("-n") and not a.startswith("--")):
            out.append(a)
    return tuple(out)


def _distinct_commands() -> dict[tuple[str, ...], list[str]]:
    """Return every distinct cited pytest command's arguments, with the places (``doc:line``) that cite it; commands
    that differ in their ``-n`` alone are one (they collect the same tests), as first cited."""
    cited: dict[tuple[str, ...], list[str]] = {}
    first: dict[tuple[str, ...], tuple[str, ...]] = {}
    for doc, line, args in _commands():
        cited.setdefault(first.setdefault(_without_workers(args), tuple(args)), []).append(f"{doc}:{line}")
    return cited


@pytest.mark.parametrize("args, where", list(_distinct_commands().items()),
                         ids=lambda v: " ".join(v) or "all" if isinstance(v, tuple) else "")
@pytest.mark.slow
def test_every_cited_pytest_command_collects(args, where):
    # collecting proves every path, node id and -k/-m expression of the command is real; running the
    # cited suites is the rest of this suite's job (a command cited in several places is collected once)
    # in one process whatever -n the command names (its value still checked): workers would each collect it again
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args,
                           "-n", "0"],
                          cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
    # status 5: it collects no test at all
    assert proc.returncode == 0, (f"{', '.join(where)}: `python -m pytest {' '.join(args)}` fails to collect:"
                                  f"\n{tail}")
