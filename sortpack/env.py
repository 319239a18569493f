"""Environment overrides (``SORTPACK_*``): the one place they are read, always when used, never at import.

Tests and debugging set them to reach layouts and paths that real data reaches only at scale
(many shards, int64 ids, no compiled kernels, no MPI); docs/architecture.md lists them.
"""
from __future__ import annotations

import os


def env_int(name: str) -> int | None:
    """Return the integer value of environment variable ``name``, or None when it is unset or empty."""
    value = os.environ.get(name, "")
    return int(value) if value else None


def env_flag(name: str) -> bool:
    """Return whether environment variable ``name`` is set to something other than "" or "0"."""
    return os.environ.get(name, "") not in ("", "0")


def env_text(name: str) -> str | None:
    """Return the value of environment variable ``name``, or None when it is unset or empty."""
    return os.environ.get(name) or None
