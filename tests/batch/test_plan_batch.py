"""``plan_batch`` as a trainer calls it: the example, each option, each refusal (one line naming the keyword), the
layouts the collates take, the step's exact loss, and an import that loads no MPI, no Arrow and no torch."""
from __future__ import annotations

import doctest
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

import sortpack
from sortpack import plan_batch
from sortpack.batch import plan as plan_module
from sortpack.errors import SortpackError

from support import ROOT


def test_the_docstring_example_runs_as_written():
    result = doctest.testmod(plan_module, verbose=False)
    assert result.attempted >= 3 and result.failed == 0


def test_import_loads_no_mpi_no_arrow_and_no_torch():
    code = ("import sys, json; import sortpack; sortpack.plan_batch; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mpi4py', 'pyarrow', 'torch', 'tqdm', 'click'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_a_package_attribute_that_does_not_exist_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sortpack.nothing  # noqa: B018


@pytest.mark.parametrize("kw,message", [
    ({"world_size": 0}, "world_size=0: expected an integer >= 1"),
    ({"max_tokens": 2.5}, "max_tokens=2.5: expected an integer"),
    ({"count_multiple": 0}, "count_multiple=0"),
    ({"cost_coeff": float("nan")}, "cost_coeff=nan"),
    ({"balance": "flops"}, "balance='flops': expected one of tokens, compute, targets"),
    ({"oversize": "skip"}, "oversize='skip'"),
    ({"balance": "targets"}, "balance='targets' balances the loss targets: pass targets="),
    ({"targets": [1, 2]}, "targets must be 1-d of 4 values"),
    ({"caps": {"a": ([1, 1, 1, 1], 5), "b": ([1, 1, 1, 1], 5)}}, "one second cap"),
    ({"caps": {"patches": ([1, 1, 1, 1], 0)}}, r"caps\['patches'\] limit 0"),
    ({"min_microbatches": 2, "equal_counts": False}, "min_microbatches counts every rank's micro-batches"),
])
def test_a_bad_option_is_one_line_naming_its_keyword(kw, message):
    with pytest.raises(SortpackError, match=message) as err:
        plan_batch([5, 6, 7, 8], **{"world_size": 2, "max_tokens": 20, **kw})
    assert "\n" not in str(err.value)


def test_bad_lengths_name_the_first_bad_index():
    with pytest.raises(SortpackError, match=r"lengths\[2\] = -1: must be >= 0"):
        plan_batch([1, 2, -1], world_size=1, max_tokens=8)
    with pytest.raises(SortpackError, match=r"lengths\[0\] = 1.5: must be an integer"):
        plan_batch([1.5, 2.0], world_size=1, max_tokens=8)
    assert plan_batch(np.array([3.0, 4.0]), world_size=1, max_tokens=8).num_microbatches == 1


def test_a_sequence_over_the_cap_is_an_error_naming_it_or_a_micro_batch_of_its_own():
    lengths = [100, 4000, 300, 5000, 200, 100]
    with pytest.raises(SortpackError, match=r"sequence 1 holds 4000 tokens, over max_tokens=1000 \(2 over"):
        plan_batch(lengths, world_size=2, max_tokens=1000)
    plan = plan_batch(lengths, world_size=2, max_tokens=1000, oversize="alone")
    mbs = [mb.tolist() for r in range(2) for mb in plan.rank(r)]
    assert [1] in mbs and [3] in mbs and plan.stats["alone"] == 2 and plan.counts() == [2, 2]
    with pytest.raises(SortpackError, match=r"padded to multiples of 64"):
        plan_batch([990, 10], world_size=1, max_tokens=1000, pad_to_multiple=64)


def test_too_few_sequences_for_equal_counts_are_refused_unless_counts_may_differ():
    with pytest.raises(SortpackError, match="3 sequences cannot give world_size=4 ranks 1 micro-batch"):
        plan_batch([10, 20, 30], world_size=4, max_tokens=100)
    plan = plan_batch([10, 20, 30], world_size=4, max_tokens=100, equal_counts=False)
    assert sorted(plan.counts()) == [0, 0, 0, 1] and plan.num_microbatches == 1  # the fewest: one row of 60


def test_equal_counts_split_rows_and_keep_every_micro_batch_under_the_cap():
    lengths = np.full(40, 100)  # ten full rows of 400 for 4 ranks x 4 micro-batches
    plan = plan_batch(lengths, world_size=4, max_tokens=400, count_multiple=2)
    assert plan.counts() == [4, 4, 4, 4] and plan.stats["rows"] == 10 and plan.stats["split"] == 6
    assert all(len(mb) and lengths[mb].sum() <= 400 for r in range(4) for mb in plan.rank(r))
    assert plan_batch(lengths, world_size=2, max_tokens=400, min_microbatches=7).counts() == [7, 7]


def test_groups_share_a_micro_batch_and_max_samples_counts_their_sequences():
    lengths = [300, 300, 300, 200, 200, 100, 100, 100]
    groups = ["a", "a", "b", "b", "c", "c", "c", "d"]
    plan = plan_batch(lengths, world_size=2, max_tokens=700, groups=groups, max_samples=3)
    for mb in (mb.tolist() for r in range(2) for mb in plan.rank(r)):
        ids = {groups[i] for i in mb}
        assert sorted(mb) == sorted(i for i, g in enumerate(groups) if g in ids) and len(mb) <= 3
    with pytest.raises(SortpackError, match=r"the group of sequence 0 holds 1200 tokens"):
        plan_batch([600, 600], world_size=1, max_tokens=1000, groups=[7, 7])


def test_balance_compute_and_targets_even_what_they_name():
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 4000, 4000)
    targets = rng.integers(0, 50, 4000) * (rng.random(4000) < 0.5)
    compute = plan_batch(lengths, world_size=8, max_tokens=16384, cost_coeff=6144.0)
    assert compute.stats["balance"] == "compute" and compute.stats["imbalance"]["cost"] < 1.001
    by_targets = plan_batch(lengths, world_size=8, max_tokens=16384, targets=targets, balance="targets")
    assert by_targets.stats["imbalance"]["targets"] < 1.01
    assert by_targets.stats["targets"] == int(targets.sum())


def test_the_layout_is_what_varlen_collate_lays_out():
    plan = plan_batch([5, 9, 3, 7], world_size=1, max_tokens=64, pad_to_multiple=4)
    (layout,) = plan.layout(0)
    assert layout["cu_seqlens"].tolist() == [0, 5, 14, 17, 24] and layout["cu_seqlens"].dtype == np.int32
    assert layout["cu_seqlens_padded"].tolist() == [0, 8, 20, 24, 32] and layout["padded_size"] == 32
    assert layout["max_seqlen"] == 9 and layout["tokens"] == 24 and layout["num_samples"] == 4
    with pytest.raises(IndexError, match="rank 1 out of range"):
        plan.rank(1)


@pytest.mark.parametrize("lengths, kw, holds", [
    ([2**31, 5], {"max_tokens": 100, "oversize": "alone"}, "2147483648 tokens,"),  # one sequence alone over int32
    ([2**30, 2**30], {"max_tokens": 2**32}, "2147483648 tokens,"),  # a cap of 2^31 or more sums past it
    ([2**31 - 1], {"max_tokens": 2**32, "pad_to_multiple": 2}, "2147483648 tokens padded,"),  # only padded past it
])
def test_a_layout_past_int32_is_one_line_not_wrapped_bounds(lengths, kw, holds):
    plan = plan_batch(lengths, world_size=1, **kw)
    with pytest.raises(SortpackError, match=f"BatchPlan.layout: rank 0's micro-batch 0 holds {holds} past int32") as e:
        plan.layout(0)
    assert "\n" not in str(e.value)
    fits = plan_batch([2**31 - 1], world_size=1, max_tokens=2**32).layout(0)[0]
    assert fits["cu_seqlens"].tolist() == [0, 2**31 - 1] and fits["padded_size"] == 2**31 - 1

@pytest.mark.torch
def test_micro_batches_collate_and_give_the_steps_exact_loss():
    torch = pytest.importorskip("torch")
    from sortpack.reader import Samples
    from sortpack.torch import step_loss, varlen_collate

    rng = np.random.default_rng(1)
    lengths = rng.integers(2, 30, 24)
    seqs = [rng.integers(1, 100, n).tolist() for n in lengths]
    plan = plan_batch(lengths, world_size=2, max_tokens=96)
    collate = varlen_collate()
    total = 0.0
    for r in range(2):
        for mb in plan.microbatches(r):
            batch = collate(Samples([seqs[i] for i in mb], mb))
            assert batch["cu_seqlens"].tolist() == plan.layout(r)[mb.microbatch - plan.firsts[r]]["cu_seqlens"].tolist()
            losses = (batch["labels"] != -100).float()  # one per target: the loss of each is 1
            total += float(step_loss(losses, batch))
    assert total == pytest.approx(2.0)  # summed over ranks' micro-batches, W times the step's mean (1)
    assert plan.stats["targets"] == int(lengths.sum()) - len(lengths)
    del torch


@pytest.mark.parametrize("max_tokens", [2**31 - 1, 2**62, 2**63 - 1])
def test_a_cap_far_over_the_batch_packs_as_any_cap_over_it_does(max_tokens):
    # best fit's compiled kernel sized its scratch by the cap: 2^31 asked numpy for 32 GiB, 2^62 overflowed the
    # size and the kernel wrote past its buffer (a segfault); any cap from the batch's total up packs alike
    lengths = [300, 100, 200, 50]
    for kw in ({}, {"max_samples": 2}, {"balance": "targets", "targets": [3, 1, 2, 1]}):
        want = plan_batch(lengths, world_size=1, max_tokens=650, **kw)
        got = plan_batch(lengths, world_size=1, max_tokens=max_tokens, **kw)
        assert [mb.tolist() for mb in got.rank(0)] == [mb.tolist() for mb in want.rank(0)]


def test_sequences_near_the_int32_limit_pack_without_a_scratch_the_size_of_the_cap():
    # three sequences of 2^30 tokens under a cap of 2^31: two micro-batches (the kernel asked for 32 GiB)
    plan = plan_batch([2**30, 2**30, 2**30], world_size=1, max_tokens=2**31)
    assert sorted(mb.tolist() for mb in plan.rank(0)) == [[0, 1], [2]]


def test_an_empty_sequence_has_no_loss_target():
    # "every token but each sequence's first": a sequence of 0 tokens has none, not -1 (the step's count was 1, not 4,
    # so step_loss divided by 1: the loss four times the mean; all-empty batches counted -3)
    plan = plan_batch([0, 0, 5, 0], world_size=1, max_tokens=10)
    (mb,) = plan.microbatches(0)
    assert plan.stats["targets"] == 4 and mb.targets == 4 and mb.step_targets == 4
    assert plan_batch([0, 0, 0], world_size=1, max_tokens=10).stats["targets"] == 0


@pytest.mark.parametrize("lengths,message", [
    ([1, 2, 2.5], r"lengths\[2\] = 2.5: must be an integer"),
    ([1.0, float("nan")], r"lengths\[1\] = nan: must be an integer"),
    ([3.0, 1e30], r"lengths\[1\] = 1e\+30: past the largest int64"),
    (np.array([3, 4, 2**63 + 5], np.uint64), r"lengths\[2\] = 9223372036854775813: past the largest int64"),
])
def test_bad_lengths_name_the_first_bad_index_and_its_value(lengths, message):
    # a non-integer named no index; a value past int64 was named by its wrapped value (lengths[2] = -92233...: must
    # be >= 0) after a RuntimeWarning of numpy's cast
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SortpackError, match=message) as err:
            plan_batch(lengths, world_size=1, max_tokens=8)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kw,message", [
    ({"cost_coeff": "6144"}, "cost_coeff='6144': expected a finite number >= 0"),
    ({"balance": ["tokens"]}, r"balance=\['tokens'\]: expected one of"),
    ({"caps": [([1, 1, 1, 1], 5)]}, r"caps=\[.*\]: expected a mapping"),
    ({"groups": [None, None, 1, 1]}, "groups must hold ids of one kind"),
])
def test_a_bad_option_of_another_type_is_one_line_naming_its_keyword(kw, message):
    # each was a TypeError from inside math, a dict, dict() or numpy's unique
    with pytest.raises(SortpackError, match=message) as err:
        plan_batch([5, 6, 7, 8], **{"world_size": 2, "max_tokens": 20, **kw})
    assert "\n" not in str(err.value)
