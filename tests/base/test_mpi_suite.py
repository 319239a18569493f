"""Runs tests/mpi under mpiexec with 2, 3 and 4 real ranks."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support import MPIEXEC, ROOT


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.slow
def test_mpi_suite(ranks):
    if MPIEXEC is None:
        pytest.skip("mpiexec not found (pip install mpich)")
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "-x", str(ROOT / "tests" / "mpi")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=str(ROOT),
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.count(" passed") == ranks
