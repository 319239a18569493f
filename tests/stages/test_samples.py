"""SampleColumns: the per-sample columns the stages pass on, and their manifest stats."""
from __future__ import annotations

import numpy as np

from sortpack.parallel import SerialComm
from sortpack.stages.samples import SampleColumns, sample_stats


def test_columns_leave_out_difficulty_that_is_the_size():
    size = np.array([3, 1, 2], np.int64)
    s = SampleColumns(0, 3, np.arange(3, dtype=np.int64), size, size)
    assert set(s.columns()) == {"sample_id", "size"}
    back = SampleColumns.from_columns(0, 3, s.columns(), [])
    assert back.difficulty is back.size  # later stages still move one array, not two


def test_columns_round_trip_with_difficulty_and_stage():
    s = SampleColumns(5, 9, np.arange(5, 8, dtype=np.int64), np.array([4, 5, 6]), np.array([0.5, 0.1, 0.9]),
                np.array([0, 1, 1], np.int16), [{"path": "x"}])
    cols = s.columns()
    assert set(cols) == {"sample_id", "size", "difficulty", "stage"}
    back = SampleColumns.from_columns(s.start, s.total, cols, s.files)
    assert len(back) == 3 and back.start == 5 and back.total == 9 and back.files == [{"path": "x"}]
    for name in cols:
        assert np.array_equal(getattr(back, name), cols[name])


def test_sample_stats_one_rank():
    s = SampleColumns(0, 4, np.arange(4, dtype=np.int64), np.array([7, 2, 9, 4]), np.array([1.5, -2.0, 0.0, 3.0]),
                np.array([0, 0, 2, 2], np.int16))
    stats = sample_stats(SerialComm(), s)
    assert stats == {"num_samples": 4, "size_sum": 22, "size_min": 2, "size_max": 9,
                     "difficulty_min": -2.0, "difficulty_max": 3.0, "stage_counts": [2, 0, 2]}


def test_sample_stats_of_an_empty_slice_without_stages():
    empty = np.zeros(0, np.int64)
    stats = sample_stats(SerialComm(), SampleColumns(0, 0, empty, empty, empty))
    assert stats["num_samples"] == 0 and stats["size_sum"] == 0 and "stage_counts" not in stats
