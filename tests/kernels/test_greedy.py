"""greedy_pack against its oracle, greedy_pack_reference, and the packing rules."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels as K

ORDERS = ("ascending", "descending", "random")
# the named costs and one no budget ships (per slot and quadratic): the kernels read the two choices, not names
COSTS = (*K.BUDGETS, K.KernelCost(per_slot=True, quadratic=True))


def arrange(sizes, order: str) -> np.ndarray:
    sizes = np.asarray(sizes, dtype=np.int64)
    if order == "ascending":
        return np.sort(sizes)
    if order == "descending":
        return np.sort(sizes)[::-1].copy()
    return sizes


@st.composite
def pack_cases(draw):
    sizes = draw(st.lists(st.integers(0, 80), max_size=40))
    order = draw(st.sampled_from(ORDERS))
    budget = draw(st.sampled_from(COSTS))
    rounding = draw(st.sampled_from(["none", "pad", "shapes"]))
    kw = dict(
        max_tokens=draw(st.one_of(st.integers(0, 400), st.floats(0, 400, allow_nan=False))),
        budget=budget,
        max_samples=draw(st.sampled_from([0, 0, 1, 2, 3, 5, 9])),
        batch_multiple=draw(st.integers(1, 8)),
        quadratic_scale=draw(st.sampled_from([1.0, 3.0, 7.5, 64.0, 0.3])),
        pad_multiple=draw(st.sampled_from([2, 4, 8, 16])) if rounding == "pad" else 0,
        # unsorted and repeated shapes too: the reference takes the first shape >= x in list order
        shapes=draw(st.lists(st.integers(1, 90), min_size=1, max_size=5)) if rounding == "shapes" else None,
    )
    return arrange(sizes, order), kw


@given(case=pack_cases())
def test_matches_reference(case):
    sizes, kw = case
    np.testing.assert_array_equal(K.greedy_pack(sizes, **kw), K.greedy_pack_reference(sizes, **kw))


@pytest.mark.parametrize("budget", COSTS)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("opts", [
    {},
    {"max_samples": 7},
    {"batch_multiple": 4},
    {"batch_multiple": 3, "max_samples": 10, "pad_multiple": 64},
    {"shapes": [4096, 512, 1024, 2048, 256, 3000]},
])
def test_matches_reference_larger(budget, order, opts):
    rng = np.random.default_rng(7)
    sizes = arrange(rng.integers(1, 4096, 3000), order)
    kw = dict(max_tokens=40_000, budget=budget, quadratic_scale=1000.0, **opts)
    if K.COSTS.get(budget, budget)[1]:  # quadratic
        kw["max_tokens"] = 400_000
    np.testing.assert_array_equal(K.greedy_pack(sizes, **kw), K.greedy_pack_reference(sizes, **kw))


def test_quadratic_sum_does_not_depend_on_the_interpreter(neumaier):
    """Costs add left to right in doubles: a budget that only compensated summation (Python
    >= 3.12's sum()) would fit never fits, under any interpreter."""
    rng = np.random.default_rng(3)
    q = 3.0
    found = 0
    for _ in range(2000):
        sizes = rng.integers(10**5, 10**6, 12)
        plain = 0.0
        for s in sizes.tolist():
            plain += s + s * s / q
        comp = neumaier([s + s * s / q for s in sizes.tolist()])
        if comp >= plain:
            continue
        found += 1
        # the whole run fits with compensated sums but not with plain ones
        got = K.greedy_pack(sizes, comp, "quadratic", quadratic_scale=q)
        np.testing.assert_array_equal(got, K.greedy_pack_reference(sizes, comp, "quadratic", quadratic_scale=q))
        assert len(got) > 2
        if found >= 10:
            break
    assert found >= 10



def test_edge_cases():
    empty = np.zeros(0, np.int64)
    np.testing.assert_array_equal(K.greedy_pack(empty, 100), [0])
    np.testing.assert_array_equal(K.greedy_pack([50], 100), [0, 1])
    np.testing.assert_array_equal(K.greedy_pack([100], 100), [0, 1])  # equal to the budget
    np.testing.assert_array_equal(K.greedy_pack([100, 100], 100), [0, 1, 2])
    np.testing.assert_array_equal(K.greedy_pack([10] * 10, 30), [0, 3, 6, 9, 10])  # all equal
    np.testing.assert_array_equal(K.greedy_pack([10] * 10, 30, batch_multiple=2), [0, 2, 4, 6, 8, 10])
    # a sample over the budget never loops: it forms a micro-batch alone
    for budget in K.BUDGETS:
        for m in (1, 3):
            sizes = [5, 500, 5, 5, 700, 5]
            np.testing.assert_array_equal(K.greedy_pack(sizes, 100, budget, batch_multiple=m),
                                          K.greedy_pack_reference(sizes, 100, budget, batch_multiple=m))
    np.testing.assert_array_equal(K.greedy_pack([5, 500, 5], 100), [0, 1, 2, 3])
    np.testing.assert_array_equal(K.greedy_pack([0, 0, 0], 0), [0, 3])


def test_input_types_and_errors():
    sizes32 = np.array([3, 9, 4, 4, 12], dtype=np.int32)
    ref = K.greedy_pack_reference(sizes32, 20)
    np.testing.assert_array_equal(K.greedy_pack(sizes32, 20), ref)
    np.testing.assert_array_equal(K.greedy_pack(sizes32.tolist(), np.int64(20)), ref)
    assert K.greedy_pack(sizes32, 20).dtype == np.int64
    with pytest.raises(ValueError, match="budget"):
        K.greedy_pack(sizes32, 20, "bogus")
    with pytest.raises(ValueError, match="batch_multiple"):
        K.greedy_pack(sizes32, 20, batch_multiple=0)
    with pytest.raises(ValueError, match="non-negative"):
        K.greedy_pack([3, -1], 20)
    with pytest.raises(ValueError, match="quadratic_scale"):
        K.greedy_pack(sizes32, 20, "quadratic", quadratic_scale=0.0)


def cost(batch, budget, q, pad_multiple=0, shapes=None):
    """Return a micro-batch's cost, written independently of the reference."""
    batch = np.asarray(batch, dtype=np.int64)
    L = int(batch.max())
    rounding = bool(pad_multiple) or bool(shapes)
    if shapes:
        L = next((s for s in shapes if s >= L), L)
    elif pad_multiple:
        L = -(-L // pad_multiple) * pad_multiple
    if budget == "padded" or rounding:
        return len(batch) * (L + L * L / q) if budget == "quadratic" else len(batch) * L
    if budget == "tokens":
        return int(batch.sum())
    return sum(int(s) + int(s) * int(s) / q for s in batch)


@given(st.lists(st.integers(1, 100), max_size=60), st.sampled_from(K.BUDGETS),
       st.sampled_from(ORDERS), st.tuples(st.sampled_from([0, 2, 5]), st.sampled_from([0, 8]),
                                          st.integers(100, 600)))
def test_budget_holds_and_batches_are_maximal(sizes, budget, order, limits):
    max_samples, pad, max_tokens = limits  # --max-samples, --pad-to-multiple, --max-tokens
    q = 50.0
    # callers drop samples that cannot fit alone before packing
    sizes = arrange([s for s in sizes if cost([s], budget, q, pad) <= max_tokens], order)
    b = K.greedy_pack(sizes, max_tokens, budget, max_samples, 1, q, pad)
    assert b[0] == 0 and b[-1] == len(sizes) and np.all(np.diff(b) > 0)
    for lo, hi in zip(b[:-1], b[1:]):
        batch = sizes[lo:hi]
        assert cost(batch, budget, q, pad) <= max_tokens  # every sample fits alone here
        assert max_samples == 0 or len(batch) <= max_samples
        if hi < len(sizes):
            grown = sizes[lo:hi + 1]
            assert cost(grown, budget, q, pad) > max_tokens or (max_samples and len(grown) > max_samples)


def test_padded_hot_path_is_fast():
    """The hot path stays a single tight pass (generous bound: the target is ~75 ms)."""
    if K.backend() != "c":
        pytest.skip("compiled kernels not built")
    import time
    sizes = np.sort(np.random.default_rng(0).integers(128, 4096, 2_000_000))
    K.greedy_pack(sizes, 500_000)
    t = time.thread_time()  # CPU time: the test machine may be shared
    K.greedy_pack(sizes, 500_000)
    assert time.thread_time() - t < 0.25


@given(st.lists(st.one_of(st.integers(0, 80), st.integers(2**61, 2**62)), max_size=60),
       st.one_of(st.integers(0, 400), st.integers(2**62, 2**63 - 1), st.floats(0, 400, allow_nan=False)),
       st.sampled_from([0, 0, 1, 3, 7]))
def test_the_tokens_budget_s_own_loop_matches_the_reference(sizes, max_tokens, max_samples):
    # the tokens cost without rounding, batch_multiple or a second size has its own compiled loop:
    # sums that overflow int64 never fit, as the reference's exact sums say
    sizes = np.asarray(sizes, dtype=np.int64)
    np.testing.assert_array_equal(K.greedy_pack(sizes, max_tokens, "tokens", max_samples),
                                  K.greedy_pack_reference(sizes, max_tokens, "tokens", max_samples))
    with pytest.raises(ValueError, match="non-negative"):
        K.greedy_pack(np.append(sizes, -1), max_tokens, "tokens", max_samples)


@st.composite
def two_cap_cases(draw):
    sizes, kw = draw(pack_cases())
    second = np.asarray(draw(st.lists(st.integers(0, 60), min_size=len(sizes), max_size=len(sizes))), np.int64)
    return sizes, second, draw(st.integers(0, 200)), kw


@given(case=two_cap_cases())
def test_a_second_size_under_its_own_cap_matches_the_reference(case, fallback):
    sizes, second, cap, kw = case
    want = K.greedy_pack_reference(sizes, sizes2=second, max2=cap, **kw)
    np.testing.assert_array_equal(fallback.greedy_pack(sizes, sizes2=second, max2=cap, **kw), want)


@given(case=two_cap_cases())
def test_the_compiled_second_cap_matches_the_reference(case):
    sizes, second, cap, kw = case
    got = K.greedy_pack(sizes, sizes2=second, max2=cap, **kw)
    np.testing.assert_array_equal(got, K.greedy_pack_reference(sizes, sizes2=second, max2=cap, **kw))
    for a, b in zip(got[:-1], got[1:]):  # every micro-batch of two samples or more under the second cap
        assert b - a == 1 or second[a:b].sum() <= cap


# sums, products and squares that pass int64: the compiled kernels check them (never fits), the reference
# computes them exactly; the fallback's int64 cumsum and products wrapped below 0 and packed them together
_HUGE = [2**61, 2**61, 2**62, 5, 3037000500, 2**40, 2**62, 0, 1, 2**62 + 7]


@pytest.mark.parametrize("budget", COSTS)
@pytest.mark.parametrize("max_tokens", [2**62, 2**63 - 1, 10**18, 1e18, 2.0**62])
def test_the_fallback_never_fits_a_sum_past_int64(budget, max_tokens, fallback):
    sizes = np.asarray(_HUGE, np.int64)
    for kw in ({}, {"max_samples": 3}, {"batch_multiple": 2}, {"pad_multiple": 8},
               {"sizes2": sizes[::-1].copy(), "max2": 2**63 - 1}):
        want = K.greedy_pack_reference(sizes, max_tokens, budget, **kw)
        np.testing.assert_array_equal(fallback.greedy_pack(sizes, max_tokens, budget, **kw), want)
