"""The --budget registry (stages/pack/budgets.py): a budget is one class; every question about it asks the class."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels
from sortpack.errors import SortpackError
from sortpack.parallel import SerialComm
from sortpack.reader import PackedIndex
from sortpack.stages.pack import PackOptions, budgets, fits, pack_samples, truncate_length
from sortpack.stages.pack.budgets import BUDGETS, Budget, budget_of
from sortpack.stages.pack.fits import oversize_mask
from sortpack.stages.samples import SampleColumns

from reader_fixtures import pipeline_index
from support import help_with


def _opts(name: str, max_tokens: int = 1000, **kw) -> PackOptions:
    return PackOptions(max_tokens=max_tokens, budget=name, quadratic_scale=kw.pop("quadratic_scale", 64.0), **kw)


def test_every_budget_is_registered_by_its_name_and_packs_with_a_kernel_budget():
    assert list(BUDGETS) == ["padded", "tokens", "quadratic"]
    for name, cls in BUDGETS.items():
        assert cls.name == name and cls.kernel in kernels.COSTS
        assert isinstance(budget_of(_opts(name)), cls)
    # varlen budgets train unpadded (cu_seqlens); padded pads, as --same-shape does for any budget
    assert [_opts(n).padded_layout for n in BUDGETS] == [True, False, False]
    assert _opts("tokens", group_size=2, same_shape=True).padded_layout


def test_an_unknown_budget_and_a_quadratic_one_without_its_scale_are_one_line():
    with pytest.raises(SortpackError, match=r"^--budget 'cubic': expected padded, tokens, quadratic$"):
        PackOptions(max_tokens=10, budget="cubic").validate()
    with pytest.raises(SortpackError, match=r"--budget quadratic needs --quadratic-scale Q > 0"):
        PackOptions(max_tokens=10, budget="quadratic").validate()


@given(st.sampled_from(list(BUDGETS)), st.integers(1, 5000), st.floats(0.5, 4096.0))
def test_the_longest_sample_alone_is_the_largest_whose_cost_alone_fits(name, max_tokens, scale):
    opts = _opts(name, max_tokens, quadratic_scale=scale)
    cap = truncate_length(opts)
    costs = budget_of(opts).cost_alone(np.array([cap, cap + 1], np.int64))
    assert costs[0] <= max_tokens < costs[1]
    sizes = np.array([cap, cap + 1], np.int64)
    assert oversize_mask(opts, sizes).tolist() == [False, True]


class PaddedAttention(Budget):
    """A budget the package does not ship: every slot at the padded length with its attention, ``c*(L + L*L/Q)``."""

    name = "padded_attention"
    help = "count*(max_size + max_size^2/Q)"
    kernel = kernels.KernelCost(per_slot=True, quadratic=True)  # a kernel cost no shipped budget names
    pads = True

    def check(self) -> None:
        if not self.opts.quadratic_scale:
            raise SortpackError("--budget padded_attention needs --quadratic-scale Q")

    def cost_is_size(self) -> bool:
        return False


def test_a_new_budget_with_a_kernel_cost_of_its_own_runs_a_job(tmp_path, monkeypatch):
    # one class: the options' check, the oversize filter, the greedy (numpy and C read its KernelCost), the index
    monkeypatch.setitem(budgets.BUDGETS, PaddedAttention.name, PaddedAttention)
    with pytest.raises(SortpackError, match="needs --quadratic-scale"):
        PackOptions(max_tokens=4000, budget="padded_attention").validate()
    lengths = np.random.default_rng(5).integers(1, 300, 400)
    plan = pipeline_index(tmp_path / "plan", lengths, max_tokens=1000, budget="padded_attention",
                          quadratic_scale=64.0, oversize="skip")
    index = PackedIndex(plan)
    assert index.manifest["options"]["budget"] == "padded_attention"
    cost = [len(mb) * (m + m * m / 64.0) for mb, m in ((index.record(i)[0], int(index["max_size"][i]))
                                                        for i in range(index.num_microbatches))]
    assert max(cost) <= 1000
    sizes = lengths[np.concatenate([index.record(i)[0] for i in range(index.num_microbatches)])]
    alone = lengths + lengths**2 / 64.0 <= 1000  # over the budget alone: skipped
    assert sorted(sizes.tolist()) == sorted(lengths[alone].tolist()) and not alone.all()
    # the greedy's maximal: the next sample in sorted order would not have fitted
    for i in range(index.num_microbatches - 1):
        ids, nxt = index.record(i)[0], index.record(i + 1)[0]
        if index["stage"][i] == index["stage"][i + 1]:
            grown = max(lengths[ids].max(), lengths[nxt].min())
            assert (len(ids) + 1) * (grown + grown * grown / 64.0) > 1000


def test_the_cli_lists_the_budgets_of_the_table():
    # the --budget choices and their help are read from the registry
    text = help_with("sortpack.stages.pack.budgets", "BUDGETS", PaddedAttention)
    assert "[padded|tokens|quadratic|padded_attention]" in text
    assert "padded_attention: count*(max_size + max_size^2/Q)." in text


def test_a_new_budget_is_one_class_in_the_registry(monkeypatch):
    class HalfTokens(Budget):
        """A budget whose samples may fill half a micro-batch alone (packed as tokens otherwise)."""

        name = "half_tokens"
        kernel = "tokens"
        pads = False

        def cost_is_size(self) -> bool:
            return False

        def cost_alone(self, lengths: np.ndarray) -> np.ndarray:
            return 2 * np.asarray(lengths, np.int64)

        def longest_alone(self) -> int:
            return self.opts.limit // 2

    monkeypatch.setitem(budgets.BUDGETS, HalfTokens.name, HalfTokens)
    opts = PackOptions(max_tokens=100, budget="half_tokens", oversize="skip")
    opts.validate()
    assert truncate_length(opts) == 50 and not opts.padded_layout
    sizes = np.array([10, 20, 40, 50, 51, 90], np.int64)
    samples = SampleColumns(0, len(sizes), np.arange(len(sizes), dtype=np.int64), sizes, sizes, None, [])
    mbs = pack_samples(SerialComm(), samples, opts)
    assert mbs.stats["skipped"] == 2  # over half the budget alone: 51 and 90
    kept = [mbs.sample_ids[a:b].tolist() for a, b in zip(mbs.offsets[:-1], mbs.offsets[1:])]
    assert kept == [[0, 1, 2], [3]]  # the tokens kernel packs the rest: 70 tokens, then 50


@given(name=st.sampled_from(list(BUDGETS)), max_tokens=st.integers(260, 600),
       rounding=st.sampled_from(["", "pad", "shapes"]), sizes=st.lists(st.integers(0, 700), max_size=40),
       sizes2=st.lists(st.integers(0, 50), max_size=40),
       policy=st.sampled_from(["error", "skip", "truncate"]), cap2=st.integers(0, 40))
def test_oversize_checks_look_at_the_largest_sample_first_and_agree_with_the_mask(
        name, max_tokens, rounding, sizes, sizes2, policy, cap2):
    kw = {"pad_to_multiple": 8} if rounding == "pad" else {"shapes": (16, 64, 256)} if rounding == "shapes" else {}
    opts = _opts(name, max_tokens, oversize=policy, max_size2=cap2, **kw)
    sizes = np.asarray(sizes, np.int64)
    size2 = np.resize(np.asarray(sizes2 or [0], np.int64), len(sizes))
    samples = SampleColumns(0, len(sizes), np.arange(len(sizes), dtype=np.int64), sizes, sizes, None, [],
                            measures={"size2": size2})
    mask = oversize_mask(opts, sizes, size2)
    maybe = fits._oversize(opts, sizes, size2)
    assert (maybe is None and not mask.any()) or np.array_equal(maybe, mask)
    if policy == "error":
        if mask.any():
            with pytest.raises(fits.OversizeError):
                fits.apply_oversize(SerialComm(), samples, opts)
            return
        fits.refuse_oversize(SerialComm(), samples, opts)
    out, info = fits.apply_oversize(SerialComm(), samples, opts)
    assert info["oversize"] == int(mask.sum())
    if policy == "skip":
        assert np.array_equal(out.size, sizes[~mask])


def test_no_oversize_mask_is_made_when_the_largest_sample_fits(monkeypatch):
    made = []
    real = fits.oversize_mask

    def spy(opts, sizes, sizes2=None):
        made.append(len(sizes))
        return real(opts, sizes, sizes2)

    monkeypatch.setattr(fits, "oversize_mask", spy)
    sizes = np.arange(1, 1001, dtype=np.int64)
    samples = SampleColumns(0, len(sizes), np.arange(len(sizes), dtype=np.int64), sizes, sizes, None, [])
    opts = PackOptions(max_tokens=1000)
    fits.refuse_oversize(SerialComm(), samples, opts)
    assert fits.apply_oversize(SerialComm(), samples, opts)[1]["oversize"] == 0
    assert fits.drop_empty(SerialComm(), samples, opts) == (samples, 0)
    assert made and max(made) == 1  # the largest alone, never a mask as long as the column
    over = PackOptions(max_tokens=999, oversize="skip")
    assert fits.apply_oversize(SerialComm(), samples, over)[1]["oversize"] == 1 and max(made) == 1000


@given(sizes=st.lists(st.integers(0, 5), max_size=30), empty_size=st.integers(0, 3), keep=st.booleans())
def test_dropping_empty_samples_agrees_with_their_mask(sizes, empty_size, keep):
    sizes = np.asarray(sizes, np.int64)
    samples = SampleColumns(0, len(sizes), np.arange(len(sizes), dtype=np.int64), sizes, sizes, None, [],
                            empty_size)
    empty = fits.content_empty(samples)
    out, count = fits.drop_empty(SerialComm(), samples, PackOptions(max_tokens=10, keep_empty=keep))
    assert count == int(empty.sum())
    assert np.array_equal(out.sample_id, samples.sample_id if keep else samples.sample_id[~empty])
