"""The numpy fallback (no compiled kernels) and the loading of the compiled ones."""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

from sortpack import kernels as K
from sortpack.kernels import _loader


def random_cases(count, seed=0):
    rng = np.random.default_rng(seed)
    for i in range(count):
        sizes = rng.integers(0, 60, rng.integers(0, 50))
        if i % 3 == 1:
            sizes = np.sort(sizes)
        elif i % 3 == 2:
            sizes = np.sort(sizes)[::-1].copy()
        rounding = i % 4
        yield sizes, dict(
            max_tokens=int(rng.integers(0, 300)) if i % 5 else float(rng.uniform(0, 300)),
            budget=K.BUDGETS[i % 3],
            max_samples=int(rng.choice([0, 0, 2, 5])),
            batch_multiple=int(rng.integers(1, 6)),
            quadratic_scale=float(rng.choice([1.0, 7.0, 0.3])),
            pad_multiple=8 if rounding == 1 else 0,
            shapes=list(rng.integers(1, 70, rng.integers(1, 5))) if rounding == 2 else None,
        )


def test_greedy_fallback_matches_reference(fallback):
    for sizes, kw in random_cases(600):
        np.testing.assert_array_equal(K.greedy_pack(sizes, **kw), K.greedy_pack_reference(sizes, **kw))


def test_greedy_fallback_long_batches(fallback):
    # batches far longer than the first guess of the per-batch window
    rng = np.random.default_rng(1)
    for budget in K.BUDGETS:
        sizes = np.sort(rng.integers(0, 20, 1500))
        kw = dict(max_tokens=6000, budget=budget, quadratic_scale=10.0, batch_multiple=3)
        np.testing.assert_array_equal(K.greedy_pack(sizes, **kw), K.greedy_pack_reference(sizes, **kw))


def test_merge_and_pack_rows_fallback(fallback, monkeypatch):
    rng = np.random.default_rng(3)
    lens = rng.integers(0, 50, 7)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    hi = np.concatenate([np.sort(rng.integers(0, 5, m)).astype(np.uint64) for m in lens])
    lo = np.zeros_like(hi)
    merged, perm = K.merge_sorted_runs(hi, offsets)
    np.testing.assert_array_equal(perm, np.argsort(hi, kind="stable"))
    np.testing.assert_array_equal(K.merge_sorted_runs2(hi, lo, offsets), np.argsort(hi, kind="stable"))
    sizes = rng.integers(0, 100, 500)
    order, splits = K.pack_rows_windows(sizes, 100, 3, 64)
    np.testing.assert_array_equal(np.sort(order), np.arange(500))
    if importlib.util.find_spec("sortpack.kernels._ckernels") is not None:
        K_c = _loader._load_clib()
        if K_c is not None:
            monkeypatch.setattr(_loader, "_clib", K_c)
            c_order, c_splits = K.pack_rows_windows(sizes, 100, 3, 64)
            np.testing.assert_array_equal(order, c_order)
            np.testing.assert_array_equal(splits, c_splits)
    with pytest.raises(ValueError, match="outside"):
        K.pack_rows([101], 100)


def test_fallback_warns_once(monkeypatch):
    monkeypatch.setattr(_loader, "_clib", None)
    monkeypatch.setattr(_loader, "_warned", False)
    with pytest.warns(RuntimeWarning, match="fallback"):
        K.greedy_pack([1, 2, 3], 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        K.greedy_pack([1, 2, 3], 10)
        K.merge_sorted_runs(np.zeros(2, np.uint64), [0, 2])
    assert K.backend() == "numpy"


def test_loading(monkeypatch):
    monkeypatch.setenv("SORTPACK_NO_CKERNELS", "1")
    assert _loader._load_clib() is None
    monkeypatch.delenv("SORTPACK_NO_CKERNELS")
    if importlib.util.find_spec("sortpack.kernels._ckernels") is None:
        pytest.skip("compiled kernels not built")
    # built: it must load (a broken build would silently fall back and be slow)
    assert _loader._load_clib() is not None, _loader._fallback_reason
    monkeypatch.setattr(_loader, "_ABI_VERSION", -1)
    assert _loader._load_clib() is None
    assert "stale" in _loader._fallback_reason
