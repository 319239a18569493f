"""The caps beside the budget: a measure's sum in every micro-batch (and in every row of ``--rows``) held to N.

A cap bounds a per-sample measure (``inputs/measures.py``): the k-th ``--max-size2 N`` caps the
k-th ``--size2``'s measure (``size2``, ``size3``, ...), ``--cap NAME=N`` any measure by name,
``--cap NAME=SPEC:N`` measures NAME by SPEC (at ``run``) and caps it. Here is what the command
line and the pack options share: the spelling of ``--cap`` (``parse_cap``), the caps of
``--max-size2`` given in order (``size2_caps``), how many caps the kernels take and the
``--cap-fit`` choices. Importing it loads neither numpy nor pyarrow.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import SortpackError
from ..inputs.measures import parse_measure, size_name

MAX_CAPS = 16  # caps beside the budget (the kernels' SP_MAX_CAPS)

# --cap-fit: how micro-batches (and rows) meet the caps beside the budget. ``runs``: the greedy cuts
# runs of the sorted order (one cap under --budget tokens in ``pack.cut.two_cap_order``), rows by that
# order too; ``best``: window-local best fit over the budget and every cap at once
# (``kernels.fit_pack``, ``pack.bestfit``); ``auto``: ``best`` from two caps on, ``runs`` for one (the
# plans of one cap keep the bytes they always had).
CAP_FITS = ("auto", "runs", "best")


class CapSpec(NamedTuple):
    """One ``--cap``: the measure's name, its SPEC (None: a measure made elsewhere) and the cap N."""

    name: str
    spec: str | None
    limit: int


def parse_cap(text: str) -> CapSpec:
    """Return the ``CapSpec`` of ``--cap NAME=SPEC:N`` (measure NAME by SPEC, cap it at N) or ``--cap NAME=N``
    (cap the measure NAME made by ``--size2``, ``--measure`` or an earlier analyze), SortpackError (one line)."""
    name, eq, rest = text.partition("=")
    name, rest = name.strip(), rest.strip()
    if not eq or not name or not rest:
        raise SortpackError(f"--cap {text!r}: expected NAME=SPEC:N (e.g. images=column:num_images:16) or NAME=N")
    spec, colon, limit = rest.rpartition(":")
    digits = (limit if colon else rest).strip()
    if not re.fullmatch(r"[0-9]+", digits) or int(digits) <= 0:
        raise SortpackError(f"--cap {text!r}: the cap N (after the last ':') must be a positive integer")
    if not colon:
        if not name.isidentifier():
            raise SortpackError(f"--cap {text!r}: {name!r} is not a measure's name")
        return CapSpec(name, None, int(digits))
    try:
        name, spec = parse_measure(f"{name}={spec.strip()}")  # a name a --measure could take
    except SortpackError as exc:
        raise SortpackError(f"--cap {text!r}: {str(exc).split(': ', 1)[-1]}") from None
    return CapSpec(name, spec, int(digits))


def size2_caps(limits: tuple[int, ...] | list[int]) -> tuple[tuple[str, int], ...]:
    """Return the caps of ``--max-size2 N`` given in order: the k-th on ``size_name(k)``, none where N is 0."""
    return tuple((size_name(k), int(n)) for k, n in enumerate(limits) if n)
