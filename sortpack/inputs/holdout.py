"""A held-out request as the user gives it (``--holdout``, MIX.json's ``"holdout"``): a count or a fraction."""
from __future__ import annotations

import json
import math

from ..errors import SortpackError


def parse_holdout(value, what: str = "--holdout") -> int | float:
    """Return a holdout request: an int N >= 1 (samples per source) or a float fraction in (0, 1).

    ``value`` is the CLI's text or a MIX.json number; ``what`` names it in the one-line error.
    """
    shown = json.dumps(value) if not isinstance(value, str) else value
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise SortpackError(f"{what} {shown}: expected a sample count N or a fraction in (0, 1)") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SortpackError(f"{what} {shown}: expected a sample count N or a fraction in (0, 1)")
    if isinstance(value, int):
        if value < 1:
            raise SortpackError(f"{what} {shown}: a count of held-out samples must be at least 1")
        return value
    if not math.isfinite(value) or not 0 < value < 1:
        raise SortpackError(f"{what} {shown}: a fraction must be in (0, 1) (a count is a whole number)")
    return float(value)
