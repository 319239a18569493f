"""Fixtures for the train-time reader tests: small indexes the real pipeline wrote."""
from __future__ import annotations

import numpy as np
import pytest

from reader_fixtures import pipeline_index, wide_ids


@pytest.fixture
def small(tmp_path):
    """An index of exactly 23 micro-batches (92 samples, at most 4 each) in shards of 5."""
    lengths = np.random.default_rng(0).integers(1, 200, size=92)
    return pipeline_index(tmp_path / "ix", lengths, max_tokens=1000, max_samples=4, rows_per_shard=5)


@pytest.fixture
def small64(tmp_path):
    """``small`` with int64 sample ids (the width of an index over more than 2^31 input rows)."""
    lengths = np.random.default_rng(0).integers(1, 200, size=92)
    with wide_ids():
        return pipeline_index(tmp_path / "ix64", lengths, max_tokens=1000, max_samples=4, rows_per_shard=5)
