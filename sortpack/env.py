"""Environment overrides (``SORTPACK_*``): the one place they are read, always when used, never at import.

Tests and debugging set them to reach layouts and paths that real data reaches only at scale
(many shards, int64 ids, no compiled kernels, no MPI); docs/architecture.md lists them.
"""
from __future__ import annotations

import os

# the integer variables sortpack reads, with the least value each takes (``check_integers``)
INTEGERS = {"SORTPACK_TEST_SHARD_ROWS": 1, "SORTPACK_TEST_SHARD_SAMPLES": 1, "SORTPACK_TEST_DATA_ROWS": 1,
            "SORTPACK_TEST_PIECE_BYTES": 1, "SORTPACK_TEST_ID_BITS": 32, "SORTPACK_OBJECT_TIMEOUT": 1,
            "SORTPACK_OBJECT_RETRIES": 1}


def env_int(name: str) -> int | None:
    """Return the integer value of environment variable ``name``, or None when it is unset or empty.

    Raises ValueError (one line naming the variable) when it is set to something else, or
    below the least value ``INTEGERS`` gives it (a job checks them all first: ``check_integers``).
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = None
    lowest = INTEGERS.get(name)
    if number is None or (lowest is not None and number < lowest):
        least = f" >= {lowest}" if lowest is not None else ""
        raise ValueError(f"the environment variable {name}={value!r} is not an integer{least}; fix or unset it")
    return number


def check_integers() -> None:
    """Raise ValueError (one line) for the first integer variable sortpack reads that is set but not one.

    A job checks them all before any work, on every rank alike: one read at a later stage would
    fail on one rank only and leave the job's temporary behind.
    """
    for name in INTEGERS:
        env_int(name)


def env_flag(name: str) -> bool:
    """Return whether environment variable ``name`` is set to something other than "" or "0"."""
    return os.environ.get(name, "") not in ("", "0")


def env_text(name: str) -> str | None:
    """Return the value of environment variable ``name``, or None when it is unset or empty."""
    return os.environ.get(name) or None
