"""The held-out choice (stages/holdout.py): exact counts per source, keyed by sample id, one-line refusals."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.stages.holdout import Holdout, held_counts, holdout_mask, parse_holdout


@given(rows=st.lists(st.integers(2, 400), min_size=1, max_size=5), seed=st.integers(0, 2**40),
       data=st.data())
def test_each_source_holds_out_exactly_its_count_whatever_the_split(rows, seed, data):
    bases = np.concatenate(([0], np.cumsum(rows)))
    counts = np.array([data.draw(st.integers(0, n - 1)) for n in rows], dtype=np.int64)
    ids = np.arange(bases[-1], dtype=np.int64)
    whole = holdout_mask(ids, bases, counts, seed)
    for k in range(len(rows)):
        assert int(whole[bases[k]:bases[k + 1]].sum()) == counts[k]
    # any split of the ids over "ranks", in any order, marks the same ids: keyed by sample id alone
    perm = np.random.default_rng(seed % 2**32).permutation(len(ids))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=4)))
    parts = np.split(perm, cuts)
    again = np.zeros(len(ids), bool)
    for part in parts:
        again[part] = holdout_mask(ids[part], bases, counts, seed)
    assert np.array_equal(whole, again)


def test_the_seed_changes_the_choice_and_sources_differ():
    bases = np.array([0, 1000, 2000])
    ids = np.arange(2000)
    a = holdout_mask(ids, bases, np.array([100, 100]), 0)
    b = holdout_mask(ids, bases, np.array([100, 100]), 1)
    assert a.sum() == b.sum() == 200 and not np.array_equal(a, b)
    # two equal sources do not hold out the same rows
    assert not np.array_equal(a[:1000], a[1000:])


def test_counts_round_half_up_and_a_larger_count_keeps_the_smaller_one():
    assert held_counts([0.1, 0.25, 7], [1000, 10, 50], ["a", "b", "c"]).tolist() == [100, 3, 7]
    bases = np.array([0, 500])
    small = holdout_mask(np.arange(500), bases, np.array([10]), 3)
    large = holdout_mask(np.arange(500), bases, np.array([60]), 3)
    assert np.all(large[small])  # growing the holdout only moves samples out of training


@pytest.mark.parametrize("value,message", [
    ("0", "at least 1"), ("-5", "at least 1"), ("1.0", "fraction must be in (0, 1)"),
    ("1.5", "fraction must be in (0, 1)"), ("-0.1", "fraction must be in (0, 1)"), ("nan", "fraction"),
    ("ten", "expected a sample count"), (True, "expected a sample count")])
def test_bad_requests_are_one_line(value, message):
    with pytest.raises(SortpackError, match=message.replace("(", r"\(").replace(")", r"\)")) as exc:
        parse_holdout(value)
    assert "\n" not in str(exc.value)


def test_requests_parse():
    assert parse_holdout("100") == 100 and isinstance(parse_holdout("100"), int)
    assert parse_holdout("0.05") == 0.05 and parse_holdout(0.5) == 0.5 and parse_holdout(3) == 3


@pytest.mark.parametrize("req,rows,message", [(100, 100, "leaving none to train on"),
                                              (500, 100, "holds out 500 of the 100 rows"),
                                              (0.001, 100, "holds out no sample")])
def test_counts_a_source_cannot_give_are_refused(req, rows, message):
    with pytest.raises(SortpackError, match=message):
        held_counts([req], [rows], ["web"])
    with pytest.raises(SortpackError, match="source 'web'"):
        Holdout.plan([None, req], [0, 50, 50 + rows], ["books", "web"], 0)


def test_the_record_names_seed_and_counts():
    plan = Holdout.plan([None, 0.5], [0, 10, 30], ["a", "b"], 7)
    assert plan is not None
    rec = plan.as_dict()
    assert rec["seed"] == 7 and rec["num_samples"] == 10
    assert [(s["name"], s["num_rows"], s["held_out"]) for s in rec["sources"]] == [("a", 10, 0), ("b", 20, 10)]
    assert Holdout.plan([None, None], [0, 1, 2], ["a", "b"], 0) is None
