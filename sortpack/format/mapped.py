"""Memory-mapped shards that change under their reader: a check before each read, a bus error as one line.

A memory-mapped file that shrinks while a process reads it (a truncation, ``cp`` or ``rsync
--inplace`` over a plan in use, a network filesystem serving a short file) makes the next
touch of a page past its new end a SIGBUS, which kills the process with no message. So the
readers record each shard's ``Identity`` (device, inode, size, modification time) when they
map it and compare it, one ``stat``, before each read that hands out its mapped memory
(``check_unchanged``): a change is a ``SortpackError`` naming the shard, before any byte of
it is read. A change in the moment between that check and the read cannot be caught so;
for it ``guard`` installs a SIGBUS handler (compiled: ``_busguard.c``) that, for a fault in a
file under a guarded directory, writes one line naming the file and ends the process with
status 135 (128 + SIGBUS). Any other bus error goes to the handler installed before it.
Without the compiled extension (or off Linux) the checks still run and a bus error keeps its
default action.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
import time
from typing import Any, NamedTuple

from ..errors import SortpackError

EXIT_CODE = 135  # 128 + SIGBUS, as the process would have died with: the line says why
_EXTENSION = __name__.rpartition(".")[0] + "._busguard"
_ABI = 1
# a shard checked this recently is not checked again: the reads of one micro-batch share one stat
RECHECK_NS = 1_000_000


class Identity(NamedTuple):
    """What a shard was when a reader mapped it: a file replaced, truncated or rewritten differs."""

    dev: int
    ino: int
    size: int
    mtime_ns: int


def identity(path: str | os.PathLike) -> Identity:
    """Return the ``Identity`` of a file now (a ``SortpackError`` when it is missing)."""
    try:
        st = os.stat(path)
    except OSError:
        raise SortpackError(f"{path}: shard listed in the manifest is missing") from None
    return Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_unchanged(path: str, known: Identity) -> None:
    """Raise ``SortpackError`` naming ``path`` unless the file is still the one ``known`` describes (one stat)."""
    if not _installed and _lib is not None:
        rearm()  # the first read after a fork
    try:
        st = os.stat(path)
    except OSError:
        raise SortpackError(f"{path}: removed while a reader had it open (the plan changed under the reader; "
                            "open it again once it is whole)") from None
    if st.st_size == known.size and st.st_mtime_ns == known.mtime_ns and st.st_ino == known.ino \
            and st.st_dev == known.dev:
        return
    if (st.st_dev, st.st_ino) != (known.dev, known.ino):
        what = "replaced by another file"
    elif st.st_size != known.size:
        what = f"{st.st_size} bytes, {known.size} when the reader opened it: truncated or rewritten in place"
    else:
        what = "modified in place"
    raise SortpackError(f"{path}: {what} while a reader had it open (the plan changed under the reader; nothing "
                        "was read from the changed file; open the plan again once it is whole)")


class ShardWatch:
    """The shards of one directory as a reader mapped them, checked unchanged before each read.

    ``opening(k)`` returns shard ``k``'s identity before it is hashed and mapped, ``mapped(k,
    known)`` records it once mapped; ``fresh(k)`` checks it (one ``stat``), at most once per
    ``RECHECK_NS`` per shard: the reads of one micro-batch (its ids, its rows, its tokens)
    share one check, and a training loop, whose micro-batches come a step apart, checks every
    read.
    """

    def __init__(self, directory, paths: list[str]):
        self.directory = directory
        self.paths = paths
        self.known: list[Identity | None] = [None] * len(paths)
        self.checked = [0] * len(paths)  # monotonic ns of each shard's last check

    def opening(self, k: int) -> Identity:
        """Return shard ``k``'s identity now, before it is read and mapped."""
        return identity(self.paths[k])

    def mapped(self, k: int, known: Identity) -> None:
        """Record shard ``k`` as mapped: it must still be ``known`` (hashing and mapping saw one file)."""
        check_unchanged(self.paths[k], known)
        guard(self.directory)
        self.known[k] = known
        self.checked[k] = time.monotonic_ns()

    def fresh(self, k: int) -> None:
        """Raise ``SortpackError`` naming shard ``k`` if it changed since it was mapped (a no-op before it is)."""
        now = time.monotonic_ns()
        if now - self.checked[k] < RECHECK_NS:
            return
        known = self.known[k]
        if known is not None:
            check_unchanged(self.paths[k], known)
            self.checked[k] = now


# --- the SIGBUS guard ---------------------------------------------------------------------------
_lock = threading.Lock()
_lib: Any = None
_loaded = False
_installed = False  # in this process: a fork (a DataLoader worker) installs again on its first read


def _load() -> Any:
    """Return the ctypes handle of ``_busguard``, or None when it was not built (or is stale)."""
    try:
        spec = importlib.util.find_spec(_EXTENSION)
        if spec is None or not spec.origin:
            return None
        lib = ctypes.CDLL(spec.origin)
        lib.sp_guard_abi.restype = ctypes.c_int64
        lib.sp_guard_install.restype = ctypes.c_int64
        lib.sp_guard_watch.restype = ctypes.c_int64
        lib.sp_guard_watch.argtypes = [ctypes.c_char_p, ctypes.c_int64]
        return lib if lib.sp_guard_abi() == _ABI else None
    except (ImportError, OSError, AttributeError, ValueError):
        return None


def _after_fork() -> None:
    global _installed
    _installed = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def guard(directory: str | os.PathLike) -> bool:
    """Name a bus error in a mapped file under ``directory`` (or that file) in one line, exit 135; return if armed.

    Installs the process's SIGBUS handler once (again after a fork: torch's DataLoader
    workers install their own); cheap when already done.
    """
    global _lib, _loaded, _installed
    with _lock:
        if not _loaded:
            _lib, _loaded = _load(), True
        if _lib is None:
            return False
        real = os.path.realpath(directory)
        prefix = os.fsencode(os.path.join(real, "") if os.path.isdir(real) else real)
        if _lib.sp_guard_watch(prefix, len(prefix)) < 0:
            return False
        _installed = _lib.sp_guard_install() >= 0
        return _installed


def available() -> bool:
    """Return whether this process can turn a bus error into one line (the compiled ``_busguard``, Linux)."""
    global _lib, _loaded
    with _lock:
        if not _loaded:
            _lib, _loaded = _load(), True
    return _lib is not None and sys.platform.startswith("linux")


def rearm() -> None:
    """Install the SIGBUS handler again if a fork reset it (a DataLoader worker's first read); a flag test otherwise."""
    global _installed
    if _installed or _lib is None:
        return
    with _lock:
        _installed = _lib.sp_guard_install() >= 0
