"""Tests of sortpack.train.goodput: the noise-scale estimator, the step-time model and the choice of A."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.train.goodput import (
    NoiseScale,
    StepTimeModel,
    adascale_gain,
    choose_accum,
    efficiency,
    goodput,
    unbiased_norms,
)


def regression_truth(delta: np.ndarray, noise_std: float) -> tuple[float, float]:
    """Return exact (|G|^2, tr(Sigma)) of the per-sample gradient of 0.5 (x.w - y)^2.

    With x ~ N(0, I_d), y = x.w* + eps, eps ~ N(0, s^2) and delta = w - w*, the gradient
    x (x.delta - eps) has mean delta and covariance (|delta|^2 + s^2) I + delta delta^T
    (Isserlis' theorem), so tr(Sigma) = d (|delta|^2 + s^2) + |delta|^2.
    """
    d2 = float(delta @ delta)
    return d2, len(delta) * (d2 + noise_std ** 2) + d2


def regression_grads(rng, delta, noise_std, n):
    """Return n per-sample gradients of the linear regression loss at w* + delta, shape (n, d)."""
    x = rng.standard_normal((n, len(delta)))
    eps = rng.normal(0.0, noise_std, n)
    return x * (x @ delta - eps)[:, None]


def test_unbiased_norms_inverts_the_expectations():
    g2, tr = 3.0, 40.0
    small, big = 8, 32
    assert unbiased_norms(g2 + tr / small, small, g2 + tr / big, big) == pytest.approx((g2, tr))
    with pytest.raises(ValueError):
        unbiased_norms(1.0, 8, 1.0, 8)


@pytest.mark.parametrize("noise_std, scale, micro, accum", [(0.5, 0.3, 8, 4), (2.0, 1.0, 8, 4),
                                                           (1.0, 0.15, 16, 8), (1.0, 0.05, 64, 8)])
def test_noise_scale_within_15_percent_on_linear_regression(noise_std, scale, micro, accum):
    rng = np.random.default_rng(0)
    d = 16
    delta = rng.standard_normal(d) * scale
    g2, tr = regression_truth(delta, noise_std)
    est = NoiseScale(smoothing=0.95)
    values = []
    for _ in range(200):
        grads = regression_grads(rng, delta, noise_std, micro * accum).reshape(accum, micro, d).mean(axis=1)
        small_sq = float(np.mean(np.sum(grads ** 2, axis=1)))
        big_sq = float(np.sum(grads.mean(axis=0) ** 2))
        est.update(small_sq, micro, big_sq, micro * accum)
        values.append(est.value)
    assert np.mean(values[20:]) == pytest.approx(tr / g2, rel=0.15)


def test_noise_scale_state_round_trip():
    est = NoiseScale(0.9)
    est.update(10.0, 4, 5.0, 16)
    copy = NoiseScale()
    copy.load_state_dict(est.state_dict())
    assert copy.value == est.value and copy.steps == 1
    assert math.isnan(NoiseScale().value)


def test_efficiency_and_gain():
    assert efficiency(100.0, 50, 50) == 1.0
    assert efficiency(100.0, 100, 50) == pytest.approx(150 / 200)
    assert efficiency(math.inf, 1000, 1) == 1.0  # all noise: a bigger batch loses nothing
    assert adascale_gain(100.0, 100, 50) == pytest.approx(2 * 150 / 200)
    assert adascale_gain(0.0, 100, 50) == pytest.approx(1.0)  # no noise: no gain from batch


def test_step_time_model_fits_alpha_and_beta():
    times = StepTimeModel(smoothing=0.0)
    for a in (2, 4):
        times.observe(a, 3.0 + 0.5 * a)
    assert times.coefficients() == pytest.approx((3.0, 0.5))
    one = StepTimeModel(smoothing=0.0)
    one.observe(4, 5.0, microbatch_seconds=0.5)
    assert one.coefficients() == pytest.approx((3.0, 0.5))
    copy = StepTimeModel()
    copy.load_state_dict(one.state_dict())
    assert copy.coefficients() == one.coefficients()


@given(noise=st.floats(0.0, 1e6), cost=st.tuples(st.floats(0.0, 10.0), st.floats(0.01, 10.0)),
       per_accum=st.floats(1.0, 1e4), bounds=st.tuples(st.integers(1, 8), st.integers(0, 16)))
def test_choose_accum_maximises_goodput(noise, cost, per_accum, bounds):
    (alpha, beta), (lo, span) = cost, bounds  # a step's seconds: alpha + beta * A
    times = StepTimeModel(smoothing=0.0)
    times.observe(1, alpha + beta)
    times.observe(2, alpha + 2 * beta)
    hi = lo + span
    best = choose_accum(per_accum, noise, per_accum, times, (lo, hi))
    accums = np.arange(lo, hi + 1)
    values = goodput(accums, per_accum, noise, per_accum, times)
    assert lo <= best <= hi
    assert values[best - lo] >= values.max() * (1 - 1e-12)


def test_choice_grows_with_the_noise_scale():
    times = StepTimeModel(smoothing=0.0)
    times.observe(1, 2.0 + 1.0)
    times.observe(2, 2.0 + 2.0)
    picks = [choose_accum(64, b, 64, times, (1, 16)) for b in (1.0, 64.0, 1024.0, 1e5)]
    assert picks == sorted(picks) and picks[0] < picks[-1]
    assert choose_accum(64, math.inf, 64, times, (1, 16)) == 16  # all noise: the biggest batch
    with pytest.raises(ValueError):
        choose_accum(64, 1.0, 64, times, (4, 2))
