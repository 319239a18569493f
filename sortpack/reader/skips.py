"""Steps and samples a run leaves out (``skip_steps``, ``skip_samples``): the loss-spike restart.

Steps are numbered in the run's numbering: step ``s`` of epoch ``e`` is run step
``e * steps_per_epoch + s`` (what a loop counting optimizer steps from the start prints
while W and A stay fixed, and ``MicroBatch.run_step``). A skipped step keeps its number, so
the steps after it keep theirs. A skipped sample is taken out of every micro-batch that holds
it; the step's ``step_batch`` and ``step_tokens`` no longer count it, so a token-exact loss
over the step stays exact, and the LR of that step follows the batch it really has. Steps
without a skipped sample are unchanged, LR included. numpy only.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class Lost(NamedTuple):
    """What skipped samples take out of some micro-batches: samples and tokens."""

    samples: int
    tokens: int


class LostPerStep(NamedTuple):
    """What skipped samples take out of each step: samples and tokens per step (int64 arrays)."""

    samples: np.ndarray
    tokens: np.ndarray


_LIMIT = 2**62  # run steps, sample ids and sizes stay far inside int64 (stop = start + 1 included)


def _whole(value) -> int | None:
    """Return ``value`` as an int when it is an integer (not a bool, not a float) in [0, 2**62), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value) if 0 <= int(value) < _LIMIT else None


def _not_text(value, what: str) -> None:
    """Refuse a string where a collection of steps or ids belongs (its characters would be taken one by one)."""
    if isinstance(value, (str, bytes)):
        wanted = "a list of sample ids or a dict of id to size" if what == "skip_samples" else "a list of steps"
        raise ValueError(f"{what}: {value!r} is not {wanted}")


def _ranges(steps) -> np.ndarray:
    """Return sorted, merged half-open ranges (k, 2) from ints, (start, stop) pairs or ``range`` objects.

    Anything else (a bool, a float, a negative or huge number, a pair of those) is one ValueError.
    """
    _not_text(steps, "skip_steps")
    pairs = []
    for item in steps or ():
        if isinstance(item, range):
            if item.step != 1:
                raise ValueError(f"skip_steps: {item!r} must have step 1")
            lo, hi = _whole(item.start), _whole(item.stop)
        elif isinstance(item, (tuple, list, np.ndarray)) and len(item) == 2:
            lo, hi = _whole(item[0]), _whole(item[1])
        else:
            lo = _whole(item)
            hi = None if lo is None else lo + 1
        if lo is None or hi is None:
            shown = tuple(item) if isinstance(item, (list, np.ndarray)) else item
            raise ValueError(f"skip_steps: {shown!r} is not a step, a (start, stop) pair or a range of steps "
                             f"(integers in [0, 2**62))")
        if hi < lo:
            raise ValueError(f"skip_steps: [{lo}, {hi}) is not a range of step numbers (0 <= start <= stop)")
        if hi > lo:
            pairs.append((lo, hi))
    pairs.sort()
    merged: list[list[int]] = []
    for lo, hi in pairs:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return np.asarray(merged, dtype=np.int64).reshape(-1, 2)


def _size_column(index):
    """Return (stored data, the stored column whose length is a sample's size) or (stored, None)."""
    stored = index.stored
    if stored is None:
        return None, None
    if stored.tokens:  # --store-tokens: len(input_ids) == size, truncation included
        return stored, stored.tokens.get("column", "input_ids")
    opts = index.options
    if opts.get("size") == "length" and opts.get("column") in stored.columns and opts.get("oversize") != "truncate":
        return stored, opts["column"]  # characters of a string, elements of a list, bytes of a binary
    return stored, None


def _sample_id(value) -> int:
    """Return a skipped sample's id as an int, or raise one ValueError."""
    checked = _whole(value)
    if checked is None:
        raise ValueError(f"skip_samples: {value!r} is not a sample id (an integer in [0, 2**62))")
    return checked


def _size(sample, value) -> int | None:
    """Return a skipped sample's given size as an int (None: read it from the plan), or raise one ValueError."""
    if value is None:
        return None
    checked = _whole(value)
    if checked is None:
        raise ValueError(f"skip_samples: the size of sample {sample!r} is {value!r}; expected an integer >= 0 "
                         f"(the plan's size units)")
    return checked


class Skips:
    """The skipped step ranges and samples of one sampler, and what they take out of each step.

    Parameters
    ----------
    index : PackedIndex
        The plan.
    steps : iterable, optional
        Run steps to skip: ints, half-open ``(start, stop)`` pairs or ``range`` objects.
    samples : iterable of int or dict, optional
        Sample ids to take out; a dict maps each id to its size (the plan's size units). Sizes
        left out are read from the plan's stored ``input_ids`` (``len(input_ids) == size``);
        a plan without stored token ids needs them given.
    """

    def __init__(self, index, steps=None, samples=None) -> None:
        self.index = index
        self.ranges = _ranges(steps)
        _not_text(samples, "skip_samples")
        sizes = dict(samples) if isinstance(samples, dict) else {i: None for i in (samples or ())}
        self.sizes: dict[int, int] = self._sizes({_sample_id(k): _size(k, v) for k, v in sizes.items()})
        self._drops()

    def __bool__(self) -> bool:
        return bool(len(self.ranges) or self.sizes)

    # --- samples ---------------------------------------------------------------------------
    def _sizes(self, given: dict) -> dict[int, int]:
        if not given:
            return {}
        ids = np.array(sorted(given), dtype=np.int64)
        mbs, places, found = self.index.find_samples(ids)
        missing = np.setdiff1d(ids, found)
        if missing.size:
            raise ValueError(f"skip_samples: sample id {int(missing[0])} is not in the plan "
                             f"({self.index.num_samples} samples)")
        # a sample is never larger than the real tokens of a micro-batch that holds it: a larger size
        # would take more tokens out of the step than it has
        holds = self.index.take("tokens", mbs).astype(np.int64)
        for k, i in enumerate(found.tolist()):
            if given[i] is not None and given[i] > holds[k]:
                raise ValueError(f"skip_samples: the size of sample {i} is {given[i]}, more than the "
                                 f"{int(holds[k])} tokens of micro-batch #{int(mbs[k])} that holds it")
        unknown = [i for i in ids.tolist() if given[i] is None]
        if unknown:
            stored, column = _size_column(self.index)
            if column is None:
                raise ValueError(f"skip_samples: the size of sample {unknown[0]} is not known (the plan stores "
                                 "neither its token ids nor its --column with --size length): pass "
                                 "{id: size} in the plan's size units, or build with --store-tokens")
            first = {int(i): k for k, i in reversed(list(enumerate(found.tolist())))}
            for i in unknown:
                k = first[i]
                row = int(stored.row_start[mbs[k]]) + int(places[k])
                given[i] = len(stored.rows(row, row + 1).column(column)[0].as_py())
        return {i: int(given[i]) for i in ids.tolist()}

    def _drops(self) -> None:
        """Tabulate, per micro-batch holding a skipped sample, the samples and tokens it loses."""
        self.drop_mbs, self._drop_count, self._drop_tokens = _EMPTY, _EMPTY, _EMPTY
        self._places: dict[int, np.ndarray] = {}
        if not self.sizes:
            return
        mbs, places, found = self.index.find_samples(list(self.sizes))
        size = np.array([self.sizes[i] for i in found.tolist()], dtype=np.int64)
        self.drop_mbs, first = np.unique(mbs, return_index=True)
        self._drop_count = np.diff(np.append(first, len(mbs)))
        self._drop_tokens = np.add.reduceat(size, first) if len(first) else _EMPTY
        for mb, lo, n in zip(self.drop_mbs.tolist(), first.tolist(), self._drop_count.tolist()):
            self._places[mb] = places[lo:lo + n]

    def lost(self, packed) -> Lost:
        """Return the samples and tokens (ints) the micro-batches ``packed`` (an array, repeats counted) lose."""
        if not self.sizes:
            return Lost(0, 0)
        packed = np.asarray(packed, dtype=np.int64).ravel()
        at = np.minimum(np.searchsorted(self.drop_mbs, packed), len(self.drop_mbs) - 1)
        hit = self.drop_mbs[at] == packed
        return Lost(int(self._drop_count[at][hit].sum()), int(self._drop_tokens[at][hit].sum()))

    def lost_per_row(self, packed: np.ndarray) -> LostPerStep:
        """Return per row of ``packed`` (steps, width) the samples and tokens (arrays) its micro-batches lose."""
        if not self.sizes:
            z = np.zeros(len(packed), dtype=np.int64)
            return LostPerStep(z, z)
        at = np.minimum(np.searchsorted(self.drop_mbs, packed), len(self.drop_mbs) - 1)
        hit = self.drop_mbs[at] == packed
        return LostPerStep((self._drop_count[at] * hit).sum(axis=1).astype(np.int64),
                           (self._drop_tokens[at] * hit).sum(axis=1).astype(np.int64))

    def kept(self, mb: int, ids: list, splits: list | None) -> tuple[list, list | None]:
        """Return micro-batch ``mb``'s ids and row splits without its skipped samples."""
        places = self._places.get(int(mb))
        if places is None:
            return ids, splits
        keep = np.ones(len(ids), dtype=bool)
        keep[places] = False
        kept = np.asarray(ids, dtype=np.int64)[keep].tolist()
        if splits is None:
            return kept, None
        # a packed row keeps its place; it holds fewer samples (more padding)
        return kept, (np.asarray(splits) - np.searchsorted(places, splits, side="left")).tolist()

    # --- steps ------------------------------------------------------------------------------
    def next_kept(self, run_step: int) -> int:
        """Return the first run step at or after ``run_step`` that is not skipped."""
        if not len(self.ranges):
            return run_step
        k = int(np.searchsorted(self.ranges[:, 0], run_step, side="right")) - 1
        if k >= 0 and run_step < self.ranges[k, 1]:
            return int(self.ranges[k, 1])
        return run_step

    def skipped_between(self, lo: int, hi: int) -> int:
        """Return how many run steps of ``[lo, hi)`` are skipped."""
        if not len(self.ranges) or hi <= lo:
            return 0
        return int((np.minimum(self.ranges[:, 1], hi) - np.maximum(self.ranges[:, 0], lo)).clip(min=0).sum())

    def kept_mask(self, run_steps: np.ndarray) -> np.ndarray:
        """Return, per run step of the array, whether it is trained on (not skipped)."""
        run_steps = np.asarray(run_steps, dtype=np.int64)
        if not len(self.ranges):
            return np.ones(run_steps.shape, dtype=bool)
        k = np.searchsorted(self.ranges[:, 0], run_steps, side="right") - 1
        inside = (k >= 0) & (run_steps < self.ranges[np.maximum(k, 0), 1])
        return ~inside

    # --- state ------------------------------------------------------------------------------
    def state(self) -> dict:
        """Return the skips as plain lists (for the sampler's state_dict)."""
        return {"skip_steps": self.ranges.tolist(), "skip_samples": [[i, s] for i, s in self.sizes.items()]}

    def merged(self, state: dict) -> Skips:
        """Return these skips joined with a state's (a restart adds skips to those its checkpoint had)."""
        steps = [tuple(r) for r in self.ranges.tolist()] + [tuple(r) for r in state.get("skip_steps", [])]
        samples = {**{int(i): int(s) for i, s in state.get("skip_samples", [])}, **self.sizes}
        if not state.get("skip_steps") and not state.get("skip_samples"):
            return self
        return Skips(self.index, steps, samples)
