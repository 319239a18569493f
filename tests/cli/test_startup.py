"""What the CLI sets up before a job: memory a job frees stays with it for its next arrays where asked (glibc)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support import ROOT

# in a fresh process: free a 256 MiB array, then print the resident MiB that stayed
_PROBE = """
import numpy as np
from sortpack.cli.startup import keep_freed_memory
kept = keep_freed_memory()
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
before = rss()
a = np.ones(32 << 20, np.int64)
del a
print(kept, rss() - before)
"""


def _probe(**env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**{k: v for k, v in os.environ.items() if k != "SORTPACK_KEEP_MEMORY"},
                              "PYTHONPATH": str(ROOT), **env}, timeout=60).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, /proc")
def test_a_freed_array_stays_for_the_next_one_where_asked():
    kept, stayed = _probe(SORTPACK_KEEP_MEMORY="1")
    assert kept == "True"
    assert stayed > 200  # MiB: the 256 MiB array's pages, ready for the next array without page faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, /proc")
@pytest.mark.parametrize("value", [None, "0"])
def test_by_default_malloc_is_left_alone(value):
    kept, stayed = _probe(**({} if value is None else {"SORTPACK_KEEP_MEMORY": value}))
    assert kept == "False"
    assert stayed < 50  # unmapped when freed, as glibc does by default


def test_only_the_command_line_process_changes_malloc(monkeypatch):
    # main(argv) called from Python (tests, notebooks) leaves the caller's malloc as it is
    from sortpack import cli
    from sortpack.cli import startup

    calls = []
    monkeypatch.setattr(startup, "keep_freed_memory", lambda: calls.append(1) or True)
    try:
        cli.main(["--version"])
    except SystemExit:
        pass
    assert calls == []
    monkeypatch.setattr(sys, "argv", ["sortpack", "--version"])
    try:
        cli.main()
    except SystemExit:
        pass
    assert calls == [1]
