"""Goodput: choose the batch size that maximises throughput x statistical efficiency (numpy only).

The model is Pollux's (Qiao et al., OSDI'21) on top of the gradient noise scale of
McCandlish et al. (2018). For a batch of M samples (or tokens) the expected squared norm of
the mean gradient is ``|G|^2 + tr(Sigma) / M``; two batch sizes observed on the same step
give unbiased estimates of ``|G|^2`` and ``tr(Sigma)``, and ``B_noise = tr(Sigma) / |G|^2``.
The statistical efficiency of batch M against a reference batch M0 is
``E(M) = (B_noise + M0) / (B_noise + M)``: the progress one sample makes at M, relative to M0.
Goodput is samples per second times E; the accumulation count A that maximises it (within the
user's bounds) is what ``choose_accum`` returns.

Nothing here knows torch: ``sortpack.torch.GoodputController`` measures the norms and step
times during training and feeds them in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def unbiased_norms(small_sq: float, small_batch: float, big_sq: float, big_batch: float) -> tuple[float, float]:
    """Return unbiased estimates ``(|G|^2, tr(Sigma))`` from squared norms at two batch sizes.

    ``small_sq`` is the (mean) squared norm of gradients averaged over ``small_batch`` items,
    ``big_sq`` that of one gradient averaged over ``big_batch`` items (``big_batch > small_batch``).
    Either estimate may be negative on a noisy step; smoothing over steps makes them useful.
    """
    if not big_batch > small_batch > 0:
        raise ValueError(f"need big_batch > small_batch > 0, got {big_batch} and {small_batch}")
    g2 = (big_batch * big_sq - small_batch * small_sq) / (big_batch - small_batch)
    trace = (small_sq - big_sq) / (1.0 / small_batch - 1.0 / big_batch)
    return float(g2), float(trace)


def efficiency(noise_scale: float, batch: float, ref_batch: float) -> float:
    """Return the statistical efficiency ``(B_noise + M0) / (B_noise + M)`` of ``batch`` against ``ref_batch``."""
    b = max(float(noise_scale), 0.0)
    if math.isinf(b):  # all noise: every sample counts fully at any batch
        return 1.0
    return (b + float(ref_batch)) / (b + float(batch))


def adascale_gain(noise_scale: float, batch: float, ref_batch: float) -> float:
    """Return the AdaScale LR gain ``(M / M0) * E(M)`` of ``batch`` against ``ref_batch`` (1 at M0)."""
    return float(batch) / float(ref_batch) * efficiency(noise_scale, batch, ref_batch)


@dataclass
class NoiseScale:
    """Smoothed gradient noise scale from per-step norm observations.

    Parameters
    ----------
    smoothing : float
        Weight of the past in the exponential moving averages of ``|G|^2`` and ``tr(Sigma)``
        (0.95: about the last 20 steps count). The ratio of the two averages is the noise
        scale, as McCandlish et al. recommend (a ratio of averages, not an average of ratios).
    """

    smoothing: float = 0.95
    _g2: float = 0.0
    _trace: float = 0.0
    _weight: float = 0.0
    steps: int = 0

    def __post_init__(self):
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing}")

    def update(self, small_sq: float, small_batch: float, big_sq: float, big_batch: float) -> None:
        """Fold one step's two norm observations into the averages."""
        g2, trace = unbiased_norms(small_sq, small_batch, big_sq, big_batch)
        a = self.smoothing
        self._g2 = a * self._g2 + (1 - a) * g2
        self._trace = a * self._trace + (1 - a) * trace
        self._weight = a * self._weight + (1 - a)
        self.steps += 1

    @property
    def grad_sq(self) -> float:
        """Return the smoothed, bias-corrected estimate of ``|G|^2``."""
        return self._g2 / self._weight if self._weight else float("nan")

    @property
    def trace(self) -> float:
        """Return the smoothed, bias-corrected estimate of ``tr(Sigma)`` (per-item gradient variance)."""
        return self._trace / self._weight if self._weight else float("nan")

    @property
    def value(self) -> float:
        """Return ``B_noise = tr(Sigma) / |G|^2`` (inf when |G|^2 is not yet positive, nan before any step)."""
        if not self._weight:
            return float("nan")
        if self._g2 <= 0:
            return math.inf
        return max(self._trace, 0.0) / self._g2

    def state_dict(self) -> dict:
        """Return the averages and step count (plain floats, for a checkpoint)."""
        return {"smoothing": self.smoothing, "g2": self._g2, "trace": self._trace,
                "weight": self._weight, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        from ..reader.state_checks import check_state, integer, real

        check_state("NoiseScale", state, {"smoothing": real(0.0, 1.0, hi_open=True), "g2": real(), "trace": real(),
                                          "weight": real(0.0, 1.0), "steps": integer(0)})
        self.smoothing = float(state["smoothing"])
        self._g2, self._trace = float(state["g2"]), float(state["trace"])
        self._weight, self.steps = float(state["weight"]), int(state["steps"])


@dataclass
class StepTimeModel:
    """Step time as ``alpha + beta * A`` (fixed cost per optimizer step plus cost per micro-batch).

    ``observe`` takes whole-step times at an accumulation count A and, when known, the time
    of one micro-batch. With steps at two or more counts the line is a least-squares fit of
    per-count averages; at one count, the micro-batch time gives the slope.

    Parameters
    ----------
    smoothing : float
        Weight of the past in the per-count moving averages.
    """

    smoothing: float = 0.9
    _by_accum: dict = field(default_factory=dict)  # A -> [smoothed step time, weight]
    _micro: list = field(default_factory=lambda: [0.0, 0.0])  # smoothed micro-batch time, weight

    def observe(self, accum: int, step_seconds: float, microbatch_seconds: float | None = None) -> None:
        """Record one step of ``accum`` micro-batches that took ``step_seconds`` in all."""
        a = self.smoothing
        t, w = self._by_accum.get(int(accum), (0.0, 0.0))
        self._by_accum[int(accum)] = [a * t + (1 - a) * step_seconds, a * w + (1 - a)]
        if microbatch_seconds is not None:
            self._micro = [a * self._micro[0] + (1 - a) * microbatch_seconds, a * self._micro[1] + (1 - a)]

    @property
    def ready(self) -> bool:
        """Return whether the model can predict (at least one step observed)."""
        return bool(self._by_accum)

    def coefficients(self) -> tuple[float, float]:
        """Return ``(alpha, beta)``: seconds per step and per micro-batch (both >= 0)."""
        if not self._by_accum:
            raise ValueError("no step times observed yet")
        accums = np.array(sorted(self._by_accum), dtype=np.float64)
        times = np.array([self._by_accum[int(k)][0] / self._by_accum[int(k)][1] for k in accums])
        if len(accums) >= 2:
            beta, alpha = np.polyfit(accums, times, 1)
        elif self._micro[1]:
            beta = self._micro[0] / self._micro[1]
            alpha = times[0] - beta * accums[0]
        else:  # one count and no micro-batch times: all cost scales with A
            beta, alpha = times[0] / accums[0], 0.0
        beta = max(float(beta), 1e-12)
        return max(float(alpha), 0.0), beta

    def predict(self, accum) -> np.ndarray:
        """Return the predicted seconds of a step of ``accum`` micro-batches."""
        alpha, beta = self.coefficients()
        return alpha + beta * np.asarray(accum, dtype=np.float64)

    def state_dict(self) -> dict:
        """Return the smoothed times (plain values, for a checkpoint)."""
        return {"smoothing": self.smoothing, "by_accum": {str(k): list(v) for k, v in self._by_accum.items()},
                "micro": list(self._micro)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        from ..reader.state_checks import check_state, real, sequence

        def by_accum(v):
            if not isinstance(v, dict):
                return "a dict of accumulation count to [time, weight]"
            for k, tw in v.items():
                if not (isinstance(k, str) and k.isdigit() and int(k) >= 1) or sequence(real(0.0), 2)(tw):
                    return "a dict of accumulation count (>= 1) to [time >= 0, weight >= 0]"
            return None

        check_state("StepTimeModel", state, {"smoothing": real(0.0, 1.0, hi_open=True), "by_accum": by_accum,
                                             "micro": sequence(real(0.0), 2)})
        self.smoothing = float(state["smoothing"])
        self._by_accum = {int(k): [float(v[0]), float(v[1])] for k, v in state["by_accum"].items()}
        self._micro = [float(v) for v in state["micro"]]


def goodput(accums, batch_per_accum: float, noise_scale: float, ref_batch: float,
            times: StepTimeModel) -> np.ndarray:
    """Return the goodput (efficiency-weighted items per second) of each accumulation count."""
    accums = np.asarray(accums, dtype=np.float64)
    batch = accums * float(batch_per_accum)
    throughput = batch / times.predict(accums)
    return throughput * np.array([efficiency(noise_scale, m, ref_batch) for m in batch])


def choose_accum(batch_per_accum: float, noise_scale: float, ref_batch: float, times: StepTimeModel,
                 bounds: tuple[int, int] = (1, 8)) -> int:
    """Return the accumulation count in ``[min_accum, max_accum]`` (``bounds``) with the highest goodput.

    The smallest count wins a tie.
    """
    min_accum, max_accum = bounds
    if not 1 <= min_accum <= max_accum:
        raise ValueError(f"need 1 <= min_accum <= max_accum, got {min_accum} and {max_accum}")
    if math.isnan(noise_scale):
        raise ValueError("no noise-scale estimate yet")
    accums = np.arange(min_accum, max_accum + 1)
    return int(accums[int(np.argmax(goodput(accums, batch_per_accum, noise_scale, ref_batch, times)))])
