"""The global size histogram and the chosen lengths over real ranks: exact, identical everywhere."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack.parallel import get_comm
from sortpack.stages.shapes import choose_shapes, global_histogram


@pytest.mark.parametrize("dense_limit", [1 << 22, 1])  # one Allreduce of counts / merged sparse pairs
@pytest.mark.parametrize("maximum", [50, 10**7])
def test_histogram_and_lengths_are_global_and_identical(dense_limit, maximum):
    comm = get_comm()
    rng = np.random.default_rng(3)
    sizes = rng.integers(0, maximum, 4000)
    cuts = np.sort(rng.integers(0, len(sizes) + 1, comm.size - 1))  # uneven slices, some maybe empty
    bounds = np.concatenate(([0], cuts, [len(sizes)]))
    mine = sizes[bounds[comm.rank]:bounds[comm.rank + 1]]
    values, counts = global_histogram(comm, mine, dense_limit)
    want_v, want_c = np.unique(np.maximum(sizes, 1), return_counts=True)
    assert np.array_equal(values, want_v) and np.array_equal(counts, want_c)
    lengths, info = choose_shapes(comm, mine, 6, dense_limit)
    everyone = comm.allgather_obj((lengths, info))
    assert all(x == everyone[0] for x in everyone)
    assert lengths[-1] == int(sizes.max()) and len(lengths) == 6
