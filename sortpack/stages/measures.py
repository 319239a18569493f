"""The per-sample measures a plan carries beside the size, and the caps on them: their names and their spellings.

A measure is an int64 number per sample, by name: ``size2`` (the first ``--size2 SPEC``), ``size3``
(the second), ..., a ``--measure NAME=SPEC`` or a ``--cap NAME=SPEC:N``, and ``targets`` (the loss
targets of fine-tuning data). Every stage moves measures without knowing their names
(``samples.SampleColumns.measures``); the index sums each per micro-batch into a column of its name.
A cap bounds a measure's sum in every micro-batch (and in every row of ``--rows``): the k-th
``--max-size2 N`` caps the k-th ``--size2``'s measure, ``--cap NAME=N`` any measure by name.

Here is what the command line, the pack options and the checks share: the names (``size_name``),
which names a SPEC may take (``check_name``), and the spellings of ``--measure`` and ``--cap``
(``parse_measure``, ``parse_cap``). Importing it loads neither numpy nor pyarrow.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import SortpackError

# a measure's name is a column's name in three directory kinds: a plain identifier
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_SIZE_N = re.compile(r"^size[0-9]+$")
# the columns a measure may not take: per-sample (metrics, sorted) and per-micro-batch (index) ones, and targets
RESERVED = frozenset(("sample_id", "size", "difficulty", "stage", "begin", "microbatch", "sample_ids", "num_samples",
                      "batch_size", "max_size", "padded_size", "tokens", "min_key", "max_key", "row_splits",
                      "source", "piece_begin", "piece_end", "attention", "targets"))
MAX_CAPS = 16  # caps beside the budget (the kernels' SP_MAX_CAPS)
# --cap-fit: how micro-batches (and rows) meet the caps beside the budget. ``runs``: the greedy cuts
# runs of the sorted order (two caps under --budget tokens in ``pack.cut.two_cap_order``), rows by that
# order too; ``best``: window-local best fit over the budget and every cap at once
# (``kernels.fit_pack``, ``pack.bestfit``); ``auto``: ``best`` from two caps on, ``runs`` for one (the plans of one
# cap keep the bytes they always had).
CAP_FITS = ("auto", "runs", "best")


def size_name(k: int) -> str:
    """Return the measure of the k-th ``--size2`` (0-based): ``size2``, ``size3``, ..."""
    return f"size{k + 2}"


def size_option(name: str) -> str:
    """Return how the command line names the measure ``name``'s SPEC: ``--size2`` or ``--size2 (3rd)``, or ``--cap
    NAME``/``--measure NAME`` for a named one."""
    if not _SIZE_N.match(name):
        return f"--measure/--cap {name}"
    k = int(name[4:]) - 1
    return "--size2" if k == 1 else f"--size2 ({k}{'nd' if k == 2 else 'rd' if k == 3 else 'th'})"


def is_size_name(name: str) -> bool:
    """Return whether ``name`` is the measure of a ``--size2`` (``size2``, ``size3``, ...)."""
    return bool(_SIZE_N.match(name))


def check_name(name: str, option: str) -> str:
    """Return ``name`` when a SPEC may measure it (SortpackError, one line naming ``option``: not an identifier,
    a reserved column, or ``sizeN``, the names of ``--size2``)."""
    if not _NAME.match(name):
        raise SortpackError(f"{option} {name!r}: a measure's name is a letter or _ then letters, digits or _ "
                            "(it names an index column)")
    if name in RESERVED:
        raise SortpackError(f"{option} {name}: {name!r} is a column of every plan; name the measure otherwise")
    if _SIZE_N.match(name):
        raise SortpackError(f"{option} {name}: sizeN names the measures of --size2 SPEC (the first size2, the "
                            "second size3, ...); name the measure otherwise")
    return name


class CapSpec(NamedTuple):
    """One ``--cap``: the measure's name, its SPEC (None: a measure made elsewhere) and the cap N."""

    name: str
    spec: str | None
    limit: int


def parse_measure(text: str) -> tuple[str, str]:
    """Return (name, SPEC) of ``--measure NAME=SPEC`` (SortpackError, one line)."""
    name, eq, spec = text.partition("=")
    if not eq or not spec:
        raise SortpackError(f"--measure {text!r}: expected NAME=SPEC, e.g. images=column:num_images")
    return check_name(name.strip(), "--measure"), spec.strip()


def parse_cap(text: str) -> CapSpec:
    """Return the ``CapSpec`` of ``--cap NAME=SPEC:N`` (measure NAME by SPEC, cap it at N) or ``--cap NAME=N``
    (cap the measure NAME made by ``--size2``, ``--measure`` or an earlier analyze), SortpackError (one line)."""
    name, eq, rest = text.partition("=")
    name, rest = name.strip(), rest.strip()
    if not eq or not name or not rest:
        raise SortpackError(f"--cap {text!r}: expected NAME=SPEC:N (e.g. images=column:num_images:16) or NAME=N")
    spec, colon, limit = rest.rpartition(":")
    digits = limit if colon else rest
    if not re.fullmatch(r"[0-9]+", digits.strip()):
        raise SortpackError(f"--cap {text!r}: the cap N after the last ':' must be a positive integer")
    n = int(digits)
    if n <= 0:
        raise SortpackError(f"--cap {text!r}: the cap N must be a positive integer")
    if not colon:
        if not _NAME.match(name):
            raise SortpackError(f"--cap {text!r}: {name!r} is not a measure's name")
        return CapSpec(name, None, n)
    return CapSpec(check_name(name, "--cap"), spec.strip(), n)


def size2_caps(limits: tuple[int, ...] | list[int]) -> tuple[tuple[str, int], ...]:
    """Return the caps of ``--max-size2 N`` given in order: the k-th on ``size_name(k)``, none where N is 0."""
    return tuple((size_name(k), int(n)) for k, n in enumerate(limits) if n)
