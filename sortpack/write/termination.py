"""SIGTERM (Slurm's time limit, ``scancel``, ``timeout``) and SIGINT (Ctrl-C): remove the job's
temporaries, say so in one ``sortpack:`` line, then exit 143 (130 for Ctrl-C).

Python runs a signal handler only between bytecodes of the main thread, and a rank waiting
in an MPI collective (or a long Arrow call) may not get there before the launcher kills it.
So the C-level handler also wakes a watcher thread (``signal.set_wakeup_fd``), which cleans
up while the main thread is still blocked: MPI and Arrow calls release the GIL. Whichever
runs first removes every registered temporary and ends the process; the others' are gone
with the job. A temporary that survives anyway (SIGKILL) is removed by the next job into
the same output (``output_guard.sweep_stale``).

One line per job, not per rank: a launcher forwards Ctrl-C to every rank, and every rank
registers the job's temporary (``OutputDir.ensure``). The rank whose cleanup removes it says
so; a rank that finds it already gone says nothing; where no rank had a temporary to remove
(a signal during start-up, or after the commit), rank 0 says it was interrupted.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_CODE = 128 + signal.SIGTERM
_SIGNALS: dict[int, str] = {signal.SIGTERM: "terminated by SIGTERM", signal.SIGINT: "interrupted (Ctrl-C)"}
_CLEANUPS: dict[int, Callable[[], str | None]] = {}
_LOCK = threading.RLock()  # held while a commit renames: a cleanup never runs half-way through one
_ONCE = threading.Lock()
_state = {"installed": False, "deferred": 0, "in_critical": 0, "owner": 0, "rank": -1}


def set_rank(rank: int) -> None:
    """Record this process's rank in its job (the communicator's): rank 0 says the job was interrupted."""
    _state["rank"] = int(rank)


def _prints_alone() -> bool:
    """Return whether this process prints the line when it removed nothing: the job's rank 0."""
    if _state["rank"] >= 0:
        return _state["rank"] == 0
    from ..launcher import printing_rank

    return printing_rank() == 0


def register(fn: Callable[[], str | None]) -> int:
    """Run ``fn`` if the job is terminated; return a key for ``unregister``.

    ``fn`` returns the name of what it removed, ``""`` when another process of the job had
    removed it already (that process says so), or None when there was nothing to remove.
    """
    with _LOCK:
        key = id(fn)
        _CLEANUPS[key] = fn
        return key


def unregister(key: int) -> None:
    """Forget the cleanup registered under ``key`` (the temporary was committed or discarded)."""
    with _LOCK:
        _CLEANUPS.pop(key, None)


@contextmanager
def critical() -> Iterator[None]:
    """Hold termination until the block ends (the renames that swap an output in)."""
    with _LOCK:
        _state["in_critical"] += 1
        _state["owner"] = threading.get_ident()
        try:
            yield
        finally:
            _state["in_critical"] -= 1
    if _state["deferred"] and not _state["in_critical"]:
        _terminate(_state["deferred"])


def _terminate(signum: int = signal.SIGTERM) -> None:
    if not _ONCE.acquire(blocking=False):
        return  # the other path is already cleaning up; it ends the process
    with _LOCK:
        removed = []
        elsewhere = False  # another rank of the job removed it: that rank prints the line
        for fn in list(_CLEANUPS.values()):
            try:
                what = fn()
            except Exception:  # noqa: BLE001 - a failed cleanup must not keep the process alive
                what = None
            if what:
                removed.append(what)
            elsewhere |= what == ""
    note = f"; removed {', '.join(removed)}" if removed else ""
    if removed or (not elsewhere and _prints_alone()):
        try:
            sys.stderr.write(f"sortpack: {_SIGNALS.get(signum, 'terminated')}{note}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
    os._exit(128 + int(signum))


def _handler(signum, frame) -> None:
    if _state["in_critical"] and _state["owner"] == threading.get_ident():
        _state["deferred"] = signum  # this thread is renaming: finish, then end
        return
    _terminate(signum)


def _watch(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        for signum in _SIGNALS:
            if signum in data:
                _terminate(signum)


def install() -> None:
    """Install the SIGTERM and SIGINT cleanup for this process (main thread; once; a no-op elsewhere)."""
    if _state["installed"] or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return  # the embedding program handles SIGTERM itself
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.signal(signal.SIGTERM, _handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        # Ctrl-C: one sortpack line and the temporaries removed, not a KeyboardInterrupt deep in MPI
        signal.signal(signal.SIGINT, _handler)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd,), name="sortpack-sigterm", daemon=True).start()
    _state["installed"] = True
