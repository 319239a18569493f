"""Checks of a loaded resume state: every field its type and range, one ValueError naming it.

A checkpoint is a file a user can edit, truncate or mix up; a wrong field must not resume
training at the wrong place (or fail later with a ZeroDivisionError).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

Check = Callable[[object], str | None]  # None when the value is fine, else what was expected


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    """Return a check for an int (not a bool, not a float) in ``[lo, hi]`` (open where None)."""
    def check(v):
        ok = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
        if ok and (lo is None or v >= lo) and (hi is None or v <= hi):
            return None
        span = "an int" if lo is None and hi is None else (
            f"an int >= {lo}" if hi is None else f"an int in [{lo if lo is not None else '-inf'}, {hi}]")
        return span
    return check


def real(lo: float | None = None, hi: float | None = None, finite: bool = True, lo_open: bool = False,
         hi_open: bool = False) -> Check:
    """Return a check for a number (int or float, not a bool) in the given range."""
    def check(v):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            return "a number"
        x = float(v)
        if math.isnan(x) or (finite and math.isinf(x)):
            return "a finite number"
        if lo is not None and (x < lo or (lo_open and x == lo)):
            return f"a number {'>' if lo_open else '>='} {lo}"
        if hi is not None and (x > hi or (hi_open and x == hi)):
            return f"a number {'<' if hi_open else '<='} {hi}"
        return None
    return check


def boolean(v) -> str | None:
    """Return None for a bool, else what was expected."""
    return None if isinstance(v, (bool, np.bool_)) else "True or False"


def one_of(*values) -> Check:
    """Return a check that the value is one of ``values``."""
    def check(v):
        return None if any(v == x and type(v) is type(x) for x in values) else f"one of {', '.join(map(repr, values))}"
    return check


def text(v) -> str | None:
    """Return None for a string, else what was expected."""
    return None if isinstance(v, str) else "a string"


def optional(inner: Check) -> Check:
    """Return a check that accepts None or what ``inner`` accepts."""
    def check(v):
        return None if v is None else inner(v)
    return check


def sequence(item: Check, length: int | None = None) -> Check:
    """Return a check for a list or tuple (of ``length`` items when given), each passing ``item``."""
    def check(v):
        if not isinstance(v, (list, tuple)) or (length is not None and len(v) != length):
            return f"a list of {length} items" if length is not None else "a list"
        for x in v:
            bad = item(x)
            if bad is not None:
                return f"a list whose items are {bad}"
        return None
    return check


def check_state(owner: str, state, fields: Mapping[str, Check], optional_keys: tuple[str, ...] = ()) -> None:
    """Raise ValueError unless ``state`` is a dict of exactly ``fields`` (``optional_keys`` may lack), all valid."""
    if not isinstance(state, Mapping):
        raise ValueError(f"{owner} state: expected a dict, not {type(state).__name__}")
    unknown = sorted(set(map(str, state)) - set(fields))
    if unknown:
        raise ValueError(f"{owner} state: unknown key(s) {', '.join(map(repr, unknown))} (a state of another object "
                         f"or version?)")
    missing = [k for k in fields if k not in state and k not in optional_keys]
    if missing:
        raise ValueError(f"{owner} state: missing key(s) {', '.join(map(repr, missing))}")
    for key, check in fields.items():
        if key in state:
            bad = check(state[key])
            if bad is not None:
                raise ValueError(f"{owner} state: {key!r} is {state[key]!r}, expected {bad}")
