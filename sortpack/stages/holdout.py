"""Held-out samples: a seeded set of each source's samples set aside for a plan of their own.

The planning half is pure: ``parse_holdout`` (inputs/holdout.py) reads a request (a count N or a fraction),
``held_counts`` turns the requests into exact counts per source, and ``holdout_mask`` says
which sample ids are held out. A sample is held out iff the keyed permutation of its row
within its source (``permutation.KeyedPermutation``, seeded per source) falls below the
source's count, so exactly that many rows of each source are chosen, and the choice depends
on the sample id alone: never on the rank count, the order the rows arrive in, or what
packing later does to them (a document cut into pieces keeps one sample id, so its pieces
all fall on one side). ``split_holdout`` is the communicating half: it splits a rank's
samples into the training part and the held-out part, each renumbered globally.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..distribute import global_start
from ..errors import SortpackError
from ..inputs.holdout import parse_holdout
from ..parallel import Comm
from ..permutation import KeyedPermutation, check_seed
from .samples import SampleColumns

if TYPE_CHECKING:
    from .pack import PackOptions

__all__ = ["DEFAULT_SEED", "DIRECTORY", "Holdout", "held_counts", "holdout_lengths", "holdout_mask", "parse_holdout",
           "split_holdout"]

DEFAULT_SEED = 0
DIRECTORY = "holdout"  # the held-out plan's directory inside the training plan's
_SALT = 0x686F6C646F7574  # "holdout": keeps the choice apart from other seeded permutations of the same seed


def held_counts(requests: list[int | float], rows: list[int], names: list[str | None],
                what: str = "--holdout") -> np.ndarray:
    """Return how many samples each source holds out: N, or FRACTION * rows rounded half up.

    Refuses (one line) a count that leaves a source no training sample and a fraction that
    rounds to no held-out sample.
    """
    counts = []
    for req, n, name in zip(requests, rows, names):
        label = f"source {name!r}" if name is not None else "the input"
        if isinstance(req, float):
            k = int(math.floor(req * n + 0.5))
            if k < 1:
                raise SortpackError(f"{what} {req}: holds out no sample of {label} ({n} rows); give a larger "
                                    f"fraction or a count")
        else:
            k = int(req)
        if k >= n:
            raise SortpackError(f"{what} {req}: holds out {k} of the {n} rows of {label}, leaving none to train "
                                f"on; give fewer than {n}")
        counts.append(k)
    return np.asarray(counts, dtype=np.int64)


def holdout_mask(ids: np.ndarray, bases: np.ndarray, counts: np.ndarray, seed: int) -> np.ndarray:
    """Return, for each sample id, whether it is held out.

    ``bases[k]`` is source k's first sample id (``bases[-1]`` the end); source k holds out the
    ``counts[k]`` rows whose seeded keyed permutation (per source) is below ``counts[k]``.
    """
    ids = np.asarray(ids, dtype=np.int64)
    bases = np.asarray(bases, dtype=np.int64)
    mask = np.zeros(len(ids), dtype=bool)
    if not len(ids):
        return mask
    one = len(bases) == 2  # one source (a plan that is no mixture): every id is of source 0
    src = None if one else np.searchsorted(bases, ids, side="right") - 1
    for k in ([0] if src is None else np.unique(src).tolist()):
        count = int(counts[k])
        if not count:
            continue
        rows = int(bases[k + 1] - bases[k])
        at = slice(None) if src is None else np.flatnonzero(src == k)
        # every id mapped forward, O(1) each: inverting the count's images and looking the ids
        # up was slower on ids in sort order (random lookups), so there is one path
        mask[at] = KeyedPermutation(rows, seed, _SALT + k).array(ids[at] - bases[k]) < count
    return mask


@dataclass(frozen=True)
class Holdout:
    """What a job holds out: per source its name, rows, request and count, and the seed."""

    seed: int
    names: list[str | None]  # None: the one source of a plan that is no mixture
    bases: np.ndarray  # first sample id of each source, plus the end
    requests: list[int | float]
    counts: np.ndarray

    @classmethod
    def plan(cls, requests: list[int | float | None], bases, names: list[str | None], seed: int,
             what: str = "--holdout") -> Holdout | None:
        """Return the holdout of sources at ``bases`` (None when no source holds anything out)."""
        if all(r is None for r in requests):
            return None
        seed = check_seed(seed, "--holdout-seed", SortpackError)
        bases = np.asarray(bases, dtype=np.int64)
        rows = np.diff(bases).tolist()
        counts = np.zeros(len(names), dtype=np.int64)
        for i, req in enumerate(requests):
            if req is not None:
                counts[i] = held_counts([req], [rows[i]], [names[i]], what)[0]
        return cls(seed, list(names), bases, [r if r is not None else 0 for r in requests], counts)

    def mask(self, ids: np.ndarray) -> np.ndarray:
        """Return whether each sample id is held out."""
        return holdout_mask(ids, self.bases, self.counts, self.seed)

    def as_dict(self) -> dict:
        """Return the manifest's ``holdout`` object: the seed and, per source, its rows, request and count."""
        return {
            "directory": DIRECTORY, "seed": self.seed, "num_samples": int(self.counts.sum()),
            "selection": "keyed permutation of the row within its source, per source seed",
            "sources": [{"name": n, "first_sample": int(self.bases[k]),
                         "num_rows": int(self.bases[k + 1] - self.bases[k]), "request": self.requests[k],
                         "held_out": int(self.counts[k])} for k, n in enumerate(self.names)],
        }


def split_holdout(comm: Comm, samples: SampleColumns, holdout: Holdout) -> tuple[SampleColumns, SampleColumns]:
    """Return (training samples, held-out samples) of this rank, each placed globally (collective).

    Both keep the order they had, so sorted samples stay sorted: holding out after the sort
    gives the same two sets in the same order as holding out before it.
    """
    held = holdout.mask(samples.sample_id)
    start, total = global_start(comm, int((~held).sum()))
    train = samples.select(~held, start, total)
    start, total = global_start(comm, int(held.sum()))
    return train, samples.select(held, start, total)


def holdout_lengths(comm: Comm, sizes: np.ndarray, popts: PackOptions, shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Return the padded lengths of a held-out plan under ``--shapes auto:K``: the training's (``shapes``).

    A held-out sample longer than every chosen length (the longest document may be held out)
    would be oversize although it fits the budget: the held-out plan then adds one length,
    its largest such size, so only samples that no plan could hold meet ``--oversize``.
    """
    from dataclasses import replace

    from .pack import truncate_length

    shapes = tuple(int(x) for x in shapes)
    cap = truncate_length(replace(popts, shapes=(), auto_shapes=None))
    fit = sizes[sizes <= cap]
    largest = comm.allreduce(int(fit.max()) if len(fit) else 0, "max")
    return shapes + (largest,) if largest > shapes[-1] else shapes
