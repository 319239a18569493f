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
registers the job's temporary (``OutputDir.ensure``) and removes it (whichever rank the
launcher leaves the time finishes it). Which rank says so is claimed before the removal, by
binding an abstract Unix socket named after the temporary: one process per host gets it
(the kernel frees it when the process ends, so nothing is left behind, and the claim touches
no file the removal walks). The rank that claims it prints the line before it removes: once
another rank has ended, the launcher may SIGKILL it at any moment, and the other ranks remove
the temporary as well. Where no rank had a temporary (a signal during start-up, or
after the commit), rank 0 says it was interrupted.
"""
from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_CODE = 128 + signal.SIGTERM
_SIGNALS: dict[int, str] = {signal.SIGTERM: "terminated by SIGTERM", signal.SIGINT: "interrupted (Ctrl-C)"}
_CLEANUPS: dict[int, Callable[[], str | None]] = {}
_CLAIMS: dict[int, str] = {}  # cleanup key -> the name of its temporary (what the line names)
_ADDRESSES: dict[int, str] = {}  # cleanup key -> the socket address that claims its line
_LOCK = threading.RLock()  # held while a commit renames: a cleanup never runs half-way through one
_ONCE = threading.Lock()
_state = {"installed": False, "deferred": 0, "in_critical": 0, "owner": 0, "rank": -1, "fork_hook": False}


def set_rank(rank: int) -> None:
    """Record this process's rank in its job (the communicator's): rank 0 says the job was interrupted."""
    _state["rank"] = int(rank)


def _prints_alone() -> bool:
    """Return whether this process prints the line when it removed nothing: the job's rank 0."""
    if _state["rank"] >= 0:
        return _state["rank"] == 0
    from ..launcher import printing_rank

    return printing_rank() == 0


def register(fn: Callable[[], str | None], claim: str | None = None) -> int:
    """Run ``fn`` if the job is terminated; return a key for ``unregister``.

    ``fn`` returns the name of what it removed, or a false value when there was nothing (left)
    to remove. ``claim``: the name of a temporary every rank of the job registers; the one
    process that claims it (per host) prints the line.
    """
    if claim is not None:
        import hashlib
        import socket  # noqa: F401 - loaded now, not in the signal's hurry

        # a fixed length under the 108 bytes of a socket name, whatever the output's name
        address = "\0sortpack-signal:" + hashlib.sha256(claim.encode("utf-8", "surrogateescape")).hexdigest()[:40]
    with _LOCK:
        key = id(fn)
        _CLEANUPS[key] = fn
        if claim is not None:
            _CLAIMS[key] = claim
            _ADDRESSES[key] = address
        return key


def unregister(key: int) -> None:
    """Forget the cleanup registered under ``key`` (the temporary was committed or discarded)."""
    with _LOCK:
        _CLEANUPS.pop(key, None)
        _CLAIMS.pop(key, None)
        _ADDRESSES.pop(key, None)


_held: list = []  # the claiming socket, kept open until the process ends


def _claim(address: str) -> bool:
    """Return whether this process is the one (on this host) to print the line claimed at ``address``.

    An abstract Unix socket (Linux) binds once per name on a host; where there are none, every
    process prints (the line may then come once per rank).
    """
    import socket

    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except (AttributeError, OSError):
        return True
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        return exc.errno != errno.EADDRINUSE  # in use: another rank of the job prints it
    _held.append(sock)
    return True


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
        claims = list(_CLAIMS.values())
        # claimed before anything is removed: a rank that finds the temporary gone has lost the claim
        prints = _claim(next(iter(_ADDRESSES.values()))) if claims else _prints_alone()
        if prints and claims:
            # the line before the removal: once another rank of the job has ended, the launcher may SIGKILL this
            # one at any moment (under load, while it still removes), and every rank removes the shared temporary
            _say(signum, claims)
        removed = []
        for fn in list(_CLEANUPS.values()):
            try:
                what = fn()
            except Exception:  # noqa: BLE001 - a failed cleanup must not keep the process alive
                what = None
            if what:
                removed.append(what)
    if prints and not claims:
        _say(signum, removed)
    os._exit(128 + int(signum))


def _say(signum: int, removed: list[str]) -> None:
    """Print the one line of a signal, naming what is removed."""
    note = f"; removed {', '.join(removed)}" if removed else ""
    try:
        sys.stderr.write(f"sortpack: {_SIGNALS.get(signum, 'terminated')}{note}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


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


def _forget_in_child() -> None:
    """Undo ``install`` in a forked child (a worker pool's process is not the job): Python's own handlers, no wakeup
    fd, no cleanups. The child shares the wakeup pipe with its parent, whose watcher would read the child's SIGTERM
    (a pool's terminate) as its own and end the parent; and the child's handler would remove the parent's
    temporaries."""
    if not _state["installed"]:
        return
    _state["installed"] = False
    _CLEANUPS.clear()
    _CLAIMS.clear()
    _ADDRESSES.clear()
    try:
        signal.set_wakeup_fd(-1)
        if signal.getsignal(signal.SIGTERM) is _handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if signal.getsignal(signal.SIGINT) is _handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread: nothing Python handles here, and no watcher thread survived the fork
        pass


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
    if not _state.get("fork_hook"):
        os.register_at_fork(after_in_child=_forget_in_child)
        _state["fork_hook"] = True
    _state["installed"] = True
