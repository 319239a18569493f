"""sort_id_ordered (a radix sort on the bits above ids that rise in input order) against np.sort, and the merges
into memory the caller holds."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels as K
from sortpack.kernels import _loader


def packed(keys: np.ndarray, id_bits: int, first: int = 0) -> np.ndarray:
    """Return the codes ``key << id_bits | id``, ids numbered from ``first`` in input order."""
    ids = np.arange(first, first + len(keys), dtype=np.uint64)
    return (np.asarray(keys, np.uint64) << np.uint64(id_bits)) | ids if id_bits < 64 else ids


@given(n=st.integers(0, 3000), key_bits=st.integers(0, 40), spread=st.sampled_from(["full", "few", "one"]),
       seed=st.integers(0, 2**32 - 1))
def test_it_sorts_as_np_sort(n, key_bits, spread, seed):
    rng = np.random.default_rng(seed)
    id_bits = max(1, int(n).bit_length())
    top = 1 << key_bits
    if spread == "few":  # many ties, digits every code shares (their passes are skipped)
        keys = rng.choice(rng.integers(0, top, 3, dtype=np.uint64), n)
    elif spread == "one":
        keys = np.full(n, top - 1, np.uint64)
    else:
        keys = rng.integers(0, top, n, dtype=np.uint64)
    codes = packed(keys, id_bits, first=int(rng.integers(0, 2)))
    assert np.array_equal(K.sort_id_ordered(codes.copy(), id_bits, key_bits), np.sort(codes))


@pytest.mark.parametrize("key_bits", [12, 13, 14, 26, 27, 39, 64 - 21])
def test_every_digit_count_sorts_a_large_rank(key_bits):
    # one to four passes, the widths the packed keys of real ranks take (21 id bits: 2M samples)
    rng = np.random.default_rng(key_bits)
    keys = rng.integers(0, 1 << key_bits, 1 << 16, dtype=np.uint64)
    codes = packed(keys, 21)
    assert np.array_equal(K.sort_id_ordered(codes.copy(), 21, key_bits), np.sort(codes))


def test_a_code_wider_than_said_is_sorted_all_the_same():
    codes = packed(np.array([5, 1, 300, 2], np.uint64), 3)  # 300 needs 9 bits, not 4
    assert np.array_equal(K.sort_id_ordered(codes.copy(), 3, 4), np.sort(codes))
    assert np.array_equal(K.sort_id_ordered(packed(np.array([1, 0], np.uint64), 1), 1, 0), [0b01, 0b10])


def test_the_fallback_gives_the_same_codes(fallback):
    rng = np.random.default_rng(3)
    codes = packed(rng.integers(0, 4096, 5000, dtype=np.uint64), 13)
    assert np.array_equal(fallback.sort_id_ordered(codes.copy(), 13, 12), np.sort(codes))


@given(n=st.integers(0, 2000), key_bits=st.sampled_from([0, 3, 12, 13, 14, 27, 40]), extra=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1))
def test_with_scratch_nothing_is_copied_back_and_the_other_buffer_is_free(n, key_bits, extra, seed):
    rng = np.random.default_rng(seed)
    id_bits = max(1, int(n).bit_length())
    codes = packed(rng.integers(0, 1 << key_bits, n, dtype=np.uint64), id_bits)
    want = np.sort(codes)
    mine, scratch = codes.copy(), np.full(n + extra, 7, np.uint64)
    got = K.sort_id_ordered(mine, id_bits, key_bits, scratch=scratch)
    assert np.array_equal(got, want)
    # the result lies at the start of one of the two buffers (no third array)
    assert got.ctypes.data in (mine.ctypes.data, scratch.ctypes.data) or n == 0
    assert np.all(scratch[n:] == 7)


def test_a_too_small_scratch_is_refused():
    with pytest.raises(ValueError, match="scratch"):
        K.sort_id_ordered(packed(np.array([2, 1], np.uint64), 1), 1, 2, scratch=np.zeros(1, np.uint64))


@given(runs=st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=25), min_size=1, max_size=9),
       spare=st.integers(0, 3))
def test_merge_between_two_buffers_needs_no_third(runs, spare):
    keys = np.concatenate([np.sort(np.asarray(r, np.uint64)) for r in runs]).astype(np.uint64)
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in runs]))).astype(np.int64)
    want = np.sort(keys)
    other = np.full(len(keys) + spare, 7, np.uint64)
    merged, free = K.merge_runs_between(keys, offsets, other)
    assert np.array_equal(merged, want)
    starts = {keys.ctypes.data, other.ctypes.data}
    assert len(keys) == 0 or (merged.ctypes.data in starts and free.ctypes.data in starts
                              and not np.shares_memory(merged, free))
    assert len(free) >= len(keys)


def test_merge_between_refuses_too_little_memory(fallback):
    keys = np.array([3, 5, 1, 2], np.uint64)
    with pytest.raises(ValueError, match="other"):
        K.merge_runs_between(keys, [0, 2, 4], np.zeros(3, np.uint64))
    merged, _ = fallback.merge_runs_between(keys, [0, 2, 3, 4], np.zeros(4, np.uint64))
    assert np.array_equal(merged, [1, 2, 3, 5])


def test_bad_widths_are_refused_or_sorted():
    codes = packed(np.array([3, 1], np.uint64), 1)
    assert np.array_equal(K.sort_id_ordered(codes.copy(), 1, 70), np.sort(codes))  # more bits than a code has


@given(runs=st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=30), min_size=1, max_size=5),
       spare=st.integers(0, 5))
def test_merge_into_writes_the_merged_runs_into_the_given_memory(runs, spare):
    keys = np.concatenate([np.sort(np.asarray(r, np.uint64)) for r in runs])
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in runs]))).astype(np.int64)
    out = np.full(len(keys) + spare, 7, np.uint64)
    got = K.merge_sorted_keys_into(keys, offsets, out)
    assert np.array_equal(got, np.sort(keys))
    assert np.shares_memory(got, out) or len(keys) == 0
    assert np.all(out[len(keys):] == 7)  # nothing past the merged keys is written


def test_merge_into_refuses_too_little_memory_and_sorts_unsorted_runs(fallback):
    keys = np.array([3, 1, 2], np.uint64)  # one run, not sorted
    with pytest.raises(ValueError):
        K.merge_sorted_keys_into(keys, [0, 3], np.zeros(2, np.uint64))
    assert np.array_equal(K.merge_sorted_keys_into(keys, [0, 3], np.zeros(3, np.uint64)), [1, 2, 3])
    assert np.array_equal(fallback.merge_sorted_keys_into(keys, [0, 3], np.zeros(4, np.uint64)), [1, 2, 3])


@contextmanager
def _kernels(compiled: bool):
    """Run the block with the compiled kernels, or with them hidden (the numpy fallback; a fixture cannot serve a
    hypothesis test's examples one by one)."""
    saved = _loader._clib, _loader._warned
    if not compiled:
        _loader._clib, _loader._warned = None, True
    try:
        yield
    finally:
        _loader._clib, _loader._warned = saved


@pytest.mark.parametrize("compiled", [True, False])
@given(a=st.lists(st.integers(0, 2**64 - 1), max_size=40), b=st.lists(st.integers(0, 2**64 - 1), max_size=40),
       own_first=st.booleans(), junk=st.integers(0, 2**64 - 1))
def test_merge_with_own_run_needs_no_memory_beyond_the_received_codes(compiled, a, b, own_first, junk):
    a, b = np.sort(np.asarray(a, np.uint64)), np.sort(np.asarray(b, np.uint64))
    received = np.concatenate((a, b)).astype(np.uint64)
    own = (a if own_first else b).copy()  # the rank's own run, still held where it was sent from
    # an exchange that skips the rank's own block leaves its place unwritten: whatever lies there
    (received[:len(a)] if own_first else received[len(a):])[...] = np.uint64(junk)
    with _kernels(compiled):
        got = K.merge_with_own_run(received, len(a), own, own_first)
    assert np.shares_memory(got, received) or len(received) == 0
    assert np.array_equal(got, np.sort(np.concatenate((a, b))))


def test_merge_with_own_run_checks_the_own_run_and_falls_back(fallback):
    received = np.array([2, 5, 1, 9], np.uint64)
    with pytest.raises(ValueError):
        K.merge_with_own_run(received.copy(), 2, np.array([1], np.uint64), True)
    assert np.array_equal(fallback.merge_with_own_run(received.copy(), 2, received[:2].copy(), True), [1, 2, 5, 9])


def test_the_fallback_refuses_a_too_small_scratch_too(fallback):
    # the fallback sorted without looking at the scratch: a caller's bad scratch failed only with the kernel built
    with pytest.raises(ValueError, match="scratch"):
        fallback.sort_id_ordered(packed(np.array([2, 1], np.uint64), 1), 1, 2, scratch=np.zeros(1, np.uint64))
