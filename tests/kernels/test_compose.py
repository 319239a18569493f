"""The kernels of rows composed by their targets: min_subsets against every subset, compose_groups with and
without the compiled kernel."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.kernels import _loader
from sortpack.kernels import compose as knapsack

rows = st.lists(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 40)), min_size=0, max_size=7), min_size=1,
                max_size=4)


def _arrays(data: list[list[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray]:
    k = max(len(r) for r in data)
    rooms = np.zeros((len(data), k), np.int64)
    targets = np.zeros((len(data), k), np.int64)
    for i, r in enumerate(data):
        for j, (a, b) in enumerate(r):
            rooms[i, j], targets[i, j] = a, b
    return rooms, targets


def _every_subset(rooms: np.ndarray, targets: np.ndarray, top: int) -> np.ndarray:
    """Return the oracle: the fewest targets over every subset of each row's samples (room 0: none) of each room."""
    out = np.full((len(rooms), top + 1), knapsack.NONE, np.int64)
    for i in range(len(rooms)):
        places = [j for j in range(rooms.shape[1]) if rooms[i, j] > 0]
        for n in range(len(places) + 1):
            for pick in itertools.combinations(places, n):
                room = int(rooms[i, list(pick)].sum())
                if room <= top:
                    out[i, room] = min(out[i, room], int(targets[i, list(pick)].sum()))
    return out


def _check(rooms: np.ndarray, targets: np.ndarray, top: int, got: np.ndarray) -> None:
    assert np.array_equal(got, _every_subset(rooms, targets, top))
    for i in range(len(rooms)):  # one subset back, with the room and the targets counted
        for room in range(top + 1):
            chosen = knapsack.subset_of(rooms[i], targets[i], room)
            if got[i, room] == knapsack.NONE:
                assert chosen == []
            else:
                assert int(rooms[i, chosen].sum()) == room and int(targets[i, chosen].sum()) == got[i, room]
                assert all(rooms[i, j] > 0 for j in chosen)


@given(rows, st.integers(0, 60))
def test_min_subsets_is_the_fewest_targets_of_every_subset(data, top):
    rooms, targets = _arrays(data)
    _check(rooms, targets, top, knapsack.min_subsets(rooms, targets, top))


@given(rows, st.integers(0, 60))
def test_the_numpy_fallback_gives_the_same(data, top):
    rooms, targets = _arrays(data)
    _check(rooms, targets, top, knapsack._min_subsets_numpy(rooms, targets, top))


@given(rows, st.integers(0, 60))
def test_negated_targets_give_the_most_targets(data, top):
    # the lightest rows take the subsets of most targets: the same knapsack of the targets negated
    rooms, targets = _arrays(data)
    _check(rooms, -targets, top, knapsack.min_subsets(rooms, -targets, top))
    _check(rooms, -targets, top, knapsack._min_subsets_numpy(rooms, -targets, top))


@given(st.lists(st.tuples(st.integers(1, 64), st.integers(0, 64)), min_size=0, max_size=300), st.integers(0, 3))
def test_equal_size_groups_compose_the_same_without_the_compiled_kernel(pairs, sweeps):
    from sortpack import kernels
    from sortpack.stages.pack.compose import compose_rows

    sizes = np.array([p[0] for p in pairs], np.int64)
    targets = np.array([min(p[0], p[1]) for p in pairs], np.int64)
    order, splits = kernels.pack_rows(sizes, 64)
    compiled = compose_rows(sizes, targets, order, splits, sweeps)
    with pytest.MonkeyPatch.context() as mp:  # the numpy fallback, as on a machine without a compiler
        mp.setattr(_loader, "_clib", None)
        mp.setattr(_loader, "_fallback_reason", "hidden by the test")
        mp.setattr(_loader, "_warned", True)
        assert kernels.backend() == "numpy"
        assert np.array_equal(compose_rows(sizes, targets, order, splits, sweeps), compiled)
