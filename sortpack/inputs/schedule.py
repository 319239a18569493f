"""A mixture's schedule: piecewise-constant source weights over the fraction of the run's tokens.

The arithmetic the writer (``mixture_plan``), ``sortpack inspect`` and the tests share: the
target of every source after a prefix of X tokens, ``target_s(X) = T * integral_0^{X/T} w_s(t) dt``,
its inverse, and the deviation of a plan's achieved tokens from those targets. Pure numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Schedule:
    """Piecewise-constant weights over the fraction t of the run: phase i holds for t in [ends[i-1], ends[i]).

    ``weights`` is (phases, sources), every row normalised to sum 1.
    """

    ends: np.ndarray
    weights: np.ndarray
    _cum: np.ndarray = field(init=False, repr=False)
    _knots: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self.ends = np.asarray(self.ends, dtype=np.float64)
        self.weights = np.asarray(self.weights, dtype=np.float64)
        self._knots = np.concatenate(([0.0], self.ends))
        spans = np.diff(self._knots)
        self._cum = np.vstack([np.zeros(self.weights.shape[1]), np.cumsum(self.weights * spans[:, None], axis=0)])

    @property
    def num_sources(self) -> int:
        """Return the number of sources."""
        return int(self.weights.shape[1])

    def shares(self) -> np.ndarray:
        """Return each source's share of the whole run (the integral of its weight over [0, 1])."""
        return self._cum[-1].copy()

    def cumulative(self, t) -> np.ndarray:
        """Return integral_0^t w_s for every t (array (len(t), sources)); past 1 the last phase goes on."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        out = np.empty((len(t), self.num_sources))
        for s in range(self.num_sources):
            out[:, s] = np.interp(t, self._knots, self._cum[:, s])
        beyond = t > 1.0
        if beyond.any():
            out[beyond] = self._cum[-1] + (t[beyond, None] - 1.0) * self.weights[-1]
        return out

    def targets(self, x, total: float) -> np.ndarray:
        """Return target tokens (len(x), sources) after prefixes of ``x`` tokens in a run of ``total``."""
        x = np.asarray(x, dtype=np.float64)
        return self.cumulative(x / total) * total

    def inverse(self, s: int, c: np.ndarray, total: float) -> np.ndarray:
        """Return, per c, the smallest prefix X at which source ``s``'s target reaches c tokens (inf: never)."""
        frac = np.asarray(c, dtype=np.float64) / total
        col = self._cum[:, s]
        i = np.searchsorted(col, frac, side="left")
        out = np.empty(len(frac))
        inside = (i > 0) & (i < len(col))
        k = i[inside]
        slope = self.weights[k - 1, s]  # > 0: the cumulative share rises on this phase
        out[inside] = self._knots[k - 1] + (frac[inside] - col[k - 1]) / slope
        out[i == 0] = 0.0
        past = i >= len(col)
        last = self.weights[-1, s]
        out[past] = (1.0 + (frac[past] - col[-1]) / last) if last > 0 else np.inf
        return out * total

    def phase_at(self, t: float) -> int:
        """Return the phase holding fraction ``t``."""
        return min(int(np.searchsorted(self.ends, t, side="right")), len(self.ends) - 1)


def schedule_dict(schedule: Schedule, names: list[str]) -> list[dict]:
    """Return the schedule as the manifest's list of ``{"until", "weights"}`` phases."""
    # normalised weights recorded to 12 digits: 0.1 reads 0.1, not 0.10000000000000002
    return [{"until": float(end), "weights": {n: round(float(w), 12) for n, w in zip(names, row)}}
            for end, row in zip(schedule.ends, schedule.weights)]


def schedule_from_dict(phases: list[dict], names: list[str]) -> Schedule:
    """Return the Schedule of a manifest's ``schedule`` list."""
    ends = [float(p["until"]) for p in phases]
    weights = [[float(p["weights"].get(n, 0.0)) for n in names] for p in phases]
    return Schedule(np.asarray(ends), np.asarray(weights))


# --- the deviation of a plan from its schedule ---------------------------------------------------
def deviations(tokens: np.ndarray, source: np.ndarray, schedule: Schedule, total: float) -> np.ndarray:
    """Return, per source, the largest |achieved - target| tokens over every prefix of the plan.

    ``tokens`` and ``source`` are per micro-batch in plan order; prefixes end after each
    micro-batch (and the empty prefix deviates by 0).
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    source = np.asarray(source, dtype=np.int64)
    x = np.cumsum(tokens).astype(np.float64)
    out = np.zeros(schedule.num_sources)
    if len(x) == 0:
        return out
    target = schedule.targets(x, total)
    for s in range(schedule.num_sources):
        achieved = np.cumsum(np.where(source == s, tokens, 0)).astype(np.float64)
        out[s] = float(np.abs(achieved - target[:, s]).max())
    return out
