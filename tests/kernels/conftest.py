"""Fixtures for the kernel tests: the numpy fallback forced on, warnings reset."""
from __future__ import annotations

import pytest

from sortpack import kernels as K
from sortpack.kernels import _loader


@pytest.fixture
def fallback(monkeypatch):
    """Run the test with the compiled kernels hidden, as on a machine without a compiler."""
    monkeypatch.setattr(_loader, "_clib", None)
    monkeypatch.setattr(_loader, "_fallback_reason", "hidden by the test")
    monkeypatch.setattr(_loader, "_warned", True)
    return K


def neumaier_sum(iterable):
    """Return sum() of an iterable of floats as CPython >= 3.12 computes it (Neumaier)."""
    it = iter(iterable)
    total = 0
    for x in it:
        total = total + x
        break
    else:
        return total
    c = 0.0
    for x in it:
        t = total + x
        if abs(total) >= abs(x):
            c += (total - t) + x
        else:
            c += (x - t) + total
        total = t
    if c and c == c and abs(c) != float("inf"):
        total += c
    return total


@pytest.fixture
def neumaier():
    """Return the emulation of CPython >= 3.12's float sum()."""
    return neumaier_sum
