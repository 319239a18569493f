"""Any number of caps beside the budget: their spellings, the options' checks, and the pack stage under them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.inputs.measures import measure_of, size_name
from sortpack.parallel import SerialComm
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.caps import parse_cap, size2_caps
from sortpack.stages.pack import OversizeError, PackOptions, pack_samples
from sortpack.stages.pack.fits import oversize_mask
from sortpack.stages.plan_options import PlanOptions
from sortpack.stages.samples import SampleColumns


def samples_of(sizes, measures: dict, stage=None) -> SampleColumns:
    """Return samples sorted by size (ties by id), each measure with them."""
    sizes = np.asarray(sizes, np.int64)
    order = np.lexsort((np.arange(len(sizes)), sizes))
    return SampleColumns(0, len(sizes), order.astype(np.int64), sizes[order], sizes[order],
                         None if stage is None else np.asarray(stage, np.int16)[order],
                         measures={k: np.asarray(v, np.int64)[order] for k, v in measures.items()})


def groups(mbs) -> list[np.ndarray]:
    return [mbs.sample_ids[a:b] for a, b in zip(mbs.offsets[:-1], mbs.offsets[1:])]


def test_spellings():
    assert parse_cap("images=column:num_images:16") == ("images", "column:num_images", 16)
    assert parse_cap("enc=python:mod:fn:8192") == ("enc", "python:mod:fn", 8192)  # the last ':' ends the SPEC
    assert parse_cap("size3=100") == ("size3", None, 100)  # a measure made elsewhere
    assert [size_name(k) for k in range(3)] == ["size2", "size3", "size4"]
    # a later --size2 is declared as the first: its measure is never cut by --oversize split
    assert measure_of("size3").pieces is None and measure_of("size3").option == "--size2"
    assert size2_caps([10, 0, 30]) == (("size2", 10), ("size4", 30))


@pytest.mark.parametrize("text,message", [
    ("images", "expected NAME=SPEC:N"),
    ("images=column:n:0", "positive integer"),
    ("images=column:n:x", "positive integer"),
    ("tokens=column:n:5", "'tokens' cannot name a measure"),
    ("size3=column:n:5", "size3 is measured by --size2"),
    ("9x=column:n:5", "'9x' cannot name a measure"),
])
def test_bad_caps_are_one_line(text, message):
    with pytest.raises(SortpackError, match=message):
        parse_cap(text)


@pytest.mark.parametrize("kw,message", [
    (dict(caps=(("a", 5), ("a", 6))), "capped twice"),
    (dict(max_size2=5, caps=(("size2", 6),)), "capped twice"),
    (dict(caps=(("a", 0),)), "positive"),
    (dict(caps=tuple((f"m{k}", 5) for k in range(17))), "at most 16"),
    (dict(caps=(("a", 5),), same_shape=True, group_size=2), "--cap and --same-shape"),
    (dict(caps=(("a", 5),), oversize="truncate"), "cannot be cut"),
    (dict(cap_fit="tight"), "--cap-fit"),
    (dict(encoder_patches="vit"), "--encoder-attention"),
    (dict(encoder_patches="vit", encoder_attention="window:0"), "window:W"),
    (dict(encoder_patches="vit", encoder_attention="full"), "full:MEASURE"),
    (dict(encoder_attention="window:64"), "--encoder-patches"),
])
def test_options_refuse_in_one_line(kw, message):
    with pytest.raises(SortpackError, match=message):
        PackOptions(max_tokens=1000, **kw).validate()


def test_best_fit_from_two_caps_on():
    assert not PackOptions(max_tokens=10, max_size2=5).best_fit  # one cap keeps the runs it always packed
    assert PackOptions(max_tokens=10, max_size2=5, cap_fit="best").best_fit
    assert PackOptions(max_tokens=10, max_size2=5, caps=(("images", 3),)).best_fit
    assert not PackOptions(max_tokens=10, caps=(("a", 3), ("b", 4)), cap_fit="runs").best_fit
    assert PackOptions(max_tokens=10, max_size2=5, caps=(("b", 4),)).cap_list == (("size2", 5), ("b", 4))


def test_the_manifest_records_caps_and_reads_them_back():
    pack = PackOptions(max_tokens=100, budget="tokens", max_size2=50, caps=(("size3", 7), ("images", 16)),
                       cap_fit="best", encoder_patches="vit", encoder_attention="window:64", encoder_coeff=100.0)
    analyze = AnalyzeOptions(size="column:seq", size2="column:img", sizes=("column:x",),
                             measures=(("images", "column:n"),))
    plan = PlanOptions(analyze, pack=pack)
    back = PlanOptions.from_manifest(plan.to_manifest())
    assert back.pack == pack and back.analyze == analyze
    # one --max-size2 alone records what it always did
    assert "caps" not in PackOptions(max_tokens=100, max_size2=50).as_dict()


def test_oversize_counts_every_cap():
    opts = PackOptions(max_tokens=100, budget="tokens", max_size2=10, caps=(("images", 2),), oversize="skip")
    sizes = np.array([5, 5, 5, 200])
    mask = oversize_mask(opts, sizes, {"size2": np.array([1, 20, 1, 1]), "images": np.array([0, 0, 3, 0])})
    assert mask.tolist() == [False, True, True, True]


def test_a_sample_over_a_named_cap_alone_is_refused_or_skipped():
    s = samples_of([10, 20, 30], {"images": [1, 9, 2]})
    opts = dict(max_tokens=100, budget="tokens", caps=(("images", 4),))
    with pytest.raises(OversizeError, match=r"1 samples have images over its cap 4 alone \(largest 9\)"):
        pack_samples(SerialComm(), s, PackOptions(**opts))
    mbs = pack_samples(SerialComm(), s, PackOptions(**opts, oversize="skip"))
    assert sorted(mbs.sample_ids.tolist()) == [0, 2] and mbs.stats["skipped"] == 1


def test_a_cap_without_its_measure_is_refused():
    s = samples_of([10, 20], {"size2": [1, 1]})
    with pytest.raises(SortpackError, match="--cap images: these samples carry no measure"):
        pack_samples(SerialComm(), s, PackOptions(max_tokens=100, caps=(("images", 4),)))
    with pytest.raises(SortpackError, match="--encoder-patches/--encoder-attention name the measure 'vit'"):
        pack_samples(SerialComm(), s, PackOptions(max_tokens=100, encoder_patches="vit",
                                                  encoder_attention="window:4"))


def _vl(n: int, seed: int):
    rng = np.random.default_rng(seed)
    text = rng.integers(1, 300, n)
    images = np.where(rng.random(n) < 0.35, 0, rng.integers(1, 5, n))
    img = images * rng.integers(10, 50, n)  # at most 196: every sample fits every cap alone
    return text + img, {"size2": img, "images": images}


@given(n=st.integers(0, 600), seed=st.integers(0, 2**16), rows=st.booleans(), budget=st.sampled_from(["tokens",
       "padded", "quadratic"]), fit=st.sampled_from(["auto", "runs", "best"]))
def test_every_sample_once_and_every_cap_held(n, seed, rows, budget, fit):
    sizes, measures = _vl(n, seed)
    s = samples_of(sizes, measures)
    caps = (("images", 9),)
    kw = dict(rows=600, rows_per_microbatch=2) if rows else dict(max_tokens=1500, budget=budget,
                                                                  quadratic_scale=300.0)
    mbs = pack_samples(SerialComm(), s, PackOptions(max_size2=200, caps=caps, cap_fit=fit, **kw))
    assert sorted(mbs.sample_ids.tolist()) == list(range(n))
    per = 2 if rows else 1  # a micro-batch of R rows holds R times a row's cap
    for name, cap in (("size2", 200), ("images", 9)):
        assert (mbs.columns[name] <= cap * per).all()
        assert mbs.columns[name].tolist() == [int(measures[name][g].sum()) for g in groups(mbs)]
    if rows:  # and every row under each cap
        order = mbs.sample_ids
        ends = np.cumsum(mbs.row_sizes)
        for a, b in zip(np.concatenate(([0], ends[:-1])), ends):
            assert measures["images"][order[a:b]].sum() <= 9 and sizes[order[a:b]].sum() <= 600
    assert sum(mbs.stats["cap_binding"].values()) == mbs.total


def test_best_fit_fills_where_runs_waste_room():
    sizes, measures = _vl(4000, 1)
    s = samples_of(sizes, measures)
    kw = dict(max_tokens=2000, budget="tokens", max_size2=500, caps=(("images", 12),))
    runs = pack_samples(SerialComm(), s, PackOptions(**kw, cap_fit="runs"))
    best = pack_samples(SerialComm(), s, PackOptions(**kw))

    def binding(mbs):
        return np.maximum.reduce([mbs.columns["tokens"] / 2000, mbs.columns["size2"] / 500,
                                  mbs.columns["images"] / 12]).mean()

    assert binding(best) >= 0.98 > binding(runs)
    assert best.total < runs.total


def test_curriculum_stages_and_shapes_are_kept():
    sizes, measures = _vl(3000, 2)
    s = samples_of(sizes, measures, stage=np.random.default_rng(0).integers(0, 3, 3000))
    mbs = pack_samples(SerialComm(), s, PackOptions(max_tokens=2000, budget="tokens", max_size2=500,
                                                   caps=(("images", 12),)))
    stage_of = dict(zip(s.sample_id.tolist(), s.stage.tolist()))
    assert all(len({stage_of[i] for i in g.tolist()}) == 1 for g in groups(mbs))  # no micro-batch spans stages
    assert (np.diff(mbs.columns["stage"]) >= 0).all()  # stages in order
    padded = pack_samples(SerialComm(), samples_of(sizes, measures),
                          PackOptions(max_tokens=4000, shapes=(128, 256, 512), max_size2=500,
                                      caps=(("images", 12),)))
    assert set(padded.columns["padded_size"].tolist()) <= {128, 256, 512}
    assert (padded.columns["batch_size"] * padded.columns["padded_size"] <= 4000).all()
