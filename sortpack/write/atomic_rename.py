"""Directory renames that never leave a moment without an output: Linux ``renameat2``.

``exchange(a, b)`` swaps two directories in one step (``RENAME_EXCHANGE``); ``move_new(a, b)``
renames ``a`` to ``b`` only when ``b`` does not exist (``RENAME_NOREPLACE``). Both return False
where the kernel, the C library or the file system lacks the call (macOS, old glibc, some
network file systems), and the caller falls back to plain renames (docs/guarantees.md).
"""
from __future__ import annotations

import ctypes
import errno
import os

from ..env import env_flag

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def _load():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = None if env_flag("SORTPACK_NO_RENAMEAT2") else _load()


def _renameat2(src: str | os.PathLike, dst: str | os.PathLike, flags: int) -> bool:
    """Return True when done, False when unsupported; raise OSError for any other failure."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), os.fsdecode(src), None, os.fsdecode(dst))


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Atomically swap directories ``a`` and ``b``; return False when the system cannot."""
    return _renameat2(a, b, RENAME_EXCHANGE)


def move_new(src: str | os.PathLike, dst: str | os.PathLike) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (FileExistsError); return False when the system cannot."""
    return _renameat2(src, dst, RENAME_NOREPLACE)
