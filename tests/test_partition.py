"""The partitioning policy: shards cut at fixed rows, ranks own whole shards."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sortpack.partition import owner_starts, shard_starts


@given(total=st.integers(0, 5000), rows=st.integers(1, 700), ranks=st.integers(1, 9))
def test_owners_hold_whole_shards_within_one_of_even(total, rows, ranks):
    starts = shard_starts(total, rows)
    owners = owner_starts(total, rows, ranks)
    assert starts[0] == 0 and starts[-1] == total and np.all(np.diff(starts)[:-1] == rows)
    assert len(owners) == ranks + 1 and owners[0] == 0 and owners[-1] == total
    assert np.all(np.diff(owners) >= 0)
    assert set(owners.tolist()) <= set(starts.tolist())  # every owner starts at a shard boundary
    shards_owned = np.diff(np.searchsorted(starts, owners))
    assert shards_owned.max() - shards_owned.min() <= 1


def test_empty_and_exact_layouts():
    assert shard_starts(0, 10).tolist() == [0]
    assert shard_starts(20, 10).tolist() == [0, 10, 20]
    assert shard_starts(21, 10).tolist() == [0, 10, 20, 21]
    assert owner_starts(21, 10, 2).tolist() == [0, 10, 21]
    assert owner_starts(5, 10, 3).tolist() == [0, 0, 0, 5]
