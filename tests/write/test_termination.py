"""The SIGTERM/SIGINT cleanup of a job (write/termination.py) and the processes a job's process forks."""
from __future__ import annotations

import subprocess
import sys

from support import ROOT

FORKED = """
import os, pathlib, signal, sys, time
from sortpack.write import termination

termination.install()
temporary = pathlib.Path(sys.argv[1])
temporary.mkdir()
termination.register(lambda: (temporary.rmdir(), "the temporary")[1])
child = os.fork()
if child == 0:  # a worker (a pool's, a DataLoader's), which inherited the handlers and the wakeup pipe
    time.sleep(30)
    os._exit(0)
time.sleep(0.3)
os.kill(child, signal.SIGTERM)  # as a pool's terminate does
os.waitpid(child, 0)
time.sleep(1.0)  # the parent's watcher thread reads the wakeup pipe
print("alive", temporary.exists(), flush=True)
"""


def test_a_forked_worker_s_sigterm_is_not_the_job_s(tmp_path):
    # a fork child shares the wakeup pipe: its SIGTERM (a pool's terminate, a DataLoader's shutdown) was read by the
    # parent's watcher as the parent's own, which removed the job's temporary and ended with 143 (it ended pytest
    # in CI's full run after a test had run the CLI in process); the child's handler would remove it too
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "tmp")], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=str(ROOT))
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.split() == ["alive", "True"] and "sortpack:" not in proc.stderr
