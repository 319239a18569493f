"""The sort's pure half (stages.sort_plan): field widths and curriculum stages of sorted positions, no MPI."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sortpack.stages.sort_plan import curriculum_stages, group_width, id_width, stage_width


def test_widths_hold_the_largest_value_and_at_least_one_bit():
    assert [group_width(g) for g in (0, 1, 2, 3, 4)] == [1, 1, 2, 2, 3]
    assert [stage_width(s) for s in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]
    assert [id_width(t) for t in (0, 1, 2, 3, 1 << 20, (1 << 20) + 1)] == [1, 1, 1, 2, 20, 21]


@given(st.integers(0, 300), st.integers(1, 9), st.integers(1, 4))
def test_stages_are_exact_quantiles_whatever_the_split_over_ranks(total, stages, ranks):
    pos = np.arange(total, dtype=np.int64)
    stage = curriculum_stages(pos, stages, total)
    assert stage.dtype == np.int16 and np.all(np.diff(stage) >= 0)
    counts = np.bincount(stage, minlength=stages)
    assert len(counts) == stages and (total == 0 or counts.max() - counts.min() <= 1)
    # a rank computes its own positions' stages alone: the pieces join to the whole
    cuts = (np.arange(ranks + 1) * total) // ranks
    parts = [curriculum_stages(pos[a:b], stages, total) for a, b in zip(cuts[:-1], cuts[1:])]
    assert np.concatenate(parts).tolist() == stage.tolist()


def test_with_groups_the_quantiles_are_taken_within_each_group():
    groups = np.array([0, 0, 0, 0, 2, 2], np.int64)
    counts = np.array([4, 0, 2, 0])
    stage = curriculum_stages(np.arange(6, dtype=np.int64), 2, 6, groups, counts)
    assert stage.tolist() == [0, 0, 1, 1, 0, 1]
