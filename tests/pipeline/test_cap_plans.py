"""Several caps from the command line to the reader: images, the encoder and the sequence of vision-language data.

The data is the benchmark's vision-language set (``benchmarks/bench_multimodal.py``): images of
28-px multiples from 224 to 1,344 px as Qwen2-VL counts them, 0-8 per sample, 35% text-only.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from benchmarks.bench_multimodal import ENC, IMAGES, SEQ, vl_set
from sortpack.reader import PackedIndex, PackedSampler
from sortpack.report.inspect import imbalance, step_costs

from support import assert_same_at_ranks, read_manifest, run_sortpack

THREE = ["--size", "column:seq", "--cap", f"enc=column:img:{ENC}", "--cap", f"images=column:images:{IMAGES}"]
ENCODER = ["--measure", "vit=column:patches", "--measure", "vit_sq=column:patches_sq", "--balance", "compute",
           "--encoder-patches", "vit", "--encoder-attention", "full:vit_sq"]
GREEDY = ["--budget", "tokens", "--max-tokens", str(SEQ)]


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    d = tmp_path_factory.mktemp("vl")
    s = vl_set(5_000, seed=5)
    pq.write_table(pa.table(s), d / "vl.parquet", row_group_size=5000)
    return d / "vl.parquet", s


def table(directory) -> pa.Table:
    m = read_manifest(directory)
    return pa.concat_tables([ipc.open_file(str(directory / s["file"])).read_all() for s in m["shards"]])


def ids_of(t: pa.Table) -> list[np.ndarray]:
    return [np.asarray(x, np.int64) for x in t.column("sample_ids").to_pylist()]


def binding(t: pa.Table, rows: int = 1) -> np.ndarray:
    return np.maximum.reduce([t.column("tokens").to_numpy() / (SEQ * rows), t.column("enc").to_numpy() / (ENC * rows),
                              t.column("images").to_numpy() / (IMAGES * rows)])


@pytest.mark.parametrize("layout", [GREEDY, ["--rows", str(SEQ)]], ids=["greedy", "rows"])
def test_three_caps_fill_the_binding_one(vl, tmp_path, layout):
    path, s = vl
    out = tmp_path / "plan"
    run_sortpack(["run", path, "-o", out, *THREE, *layout])
    t = table(out)
    ids = ids_of(t)
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(len(s["seq"])))  # every sample once
    for column, name in (("enc", "img"), ("images", "images")):  # each cap summed per micro-batch, under its N
        assert t.column(column).to_pylist() == [int(s[name][i].sum()) for i in ids]
    assert (t.column("enc").to_numpy() <= ENC).all() and (t.column("images").to_numpy() <= IMAGES).all()
    assert (t.column("tokens").to_numpy() <= SEQ).all()
    assert binding(t).mean() >= 0.98  # runs of the sorted order fill the binding cap to about 0.75
    m = read_manifest(out)
    assert m["options"]["caps"] == [["enc", ENC], ["images", IMAGES]]
    assert sum(m["stats"]["cap_binding"].values()) == m["num_microbatches"]
    report = json.loads(run_sortpack(["inspect", out, "--world-size", "8", "--json"]).stdout)
    assert report["cap_fills"]["binding"] == pytest.approx(binding(t).mean())
    assert report["cap_fills"]["images"] == pytest.approx((t.column("images").to_numpy() / IMAGES).mean())
    assert report["cap_binding"] == m["stats"]["cap_binding"]
    assert set(report["cap_imbalance"]) == {"enc", "images"}


@pytest.mark.slow  # several whole jobs
def test_one_cap_packs_runs_as_before(vl, tmp_path):
    path, _ = vl
    out = tmp_path / "plan"
    run_sortpack(["run", path, "-o", out, "--size", "column:seq", "--size2", "column:img", "--max-size2", str(ENC),
                  *GREEDY])
    t = table(out)
    fill = np.maximum(t.column("tokens").to_numpy() / SEQ, t.column("size2").to_numpy() / ENC).mean()
    assert fill < 0.8  # the sorted order's runs: why several caps pack by best fit
    assert "cap_binding" not in read_manifest(out)["stats"]  # the plan of one cap keeps the bytes it had
    best = tmp_path / "best"
    run_sortpack(["run", path, "-o", best, "--size", "column:seq", "--size2", "column:img", "--max-size2", str(ENC),
                  *GREEDY, "--cap-fit", "best"])
    t = table(best)
    assert np.maximum(t.column("tokens").to_numpy() / SEQ, t.column("size2").to_numpy() / ENC).mean() >= 0.98


@pytest.mark.slow  # several whole jobs
def test_size2_repeated_and_pack_caps_by_name(vl, tmp_path):
    path, s = vl
    run_sortpack(["run", path, "-o", tmp_path / "p", "--size", "column:seq", "--size2", "column:img", "--size2",
                  "column:images", "--max-size2", str(ENC), "--max-size2", str(IMAGES), *GREEDY,
                  "--keep-intermediate"])
    t = table(tmp_path / "p")
    assert (t.column("size2").to_numpy() <= ENC).all() and (t.column("size3").to_numpy() <= IMAGES).all()
    assert read_manifest(tmp_path / "p")["options"]["caps"] == [["size3", IMAGES]]
    # pack caps the sorted input's measures by name: the same plan
    run_sortpack(["pack", tmp_path / "p.sorted", "-o", tmp_path / "q", "--max-size2", str(ENC), "--cap",
                  f"size3={IMAGES}", *GREEDY])
    assert table(tmp_path / "q").equals(t)


@pytest.mark.parametrize("args,message", [
    (["--max-size2", "5", "--max-size2", "6", "--size2", "column:img"], "2 --max-size2 for 1 --size2"),
    (["--cap", "images=16"], "no option measures 'images'"),
    (["--encoder-patches", "vit", "--encoder-attention", "window:64"], "no option measures 'vit'"),
    (["--cap", "images=column:images:16", "--measure", "images=column:img"], "the measure is given twice"),
    (["--cap", "tokens=column:images:16"], "'tokens' cannot name a measure"),
    (["--cap", "a=column:images:3", "--cap", "a=5"], "the measure is given twice|capped twice"),
])
def test_usage_errors_are_one_line_before_any_work(vl, tmp_path, args, message):
    path, _ = vl
    proc = run_sortpack(["run", path, "-o", tmp_path / "p", "--size", "column:seq", *GREEDY, *args], check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert __import__("re").search(message, proc.stderr), proc.stderr
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.metrics").exists()


@pytest.mark.slow  # several whole jobs
def test_pack_measures_nothing(vl, tmp_path):
    path, _ = vl
    run_sortpack(["run", path, "-o", tmp_path / "p", "--size", "column:seq", *GREEDY, "--keep-intermediate"])
    proc = run_sortpack(["pack", tmp_path / "p.sorted", "-o", tmp_path / "q", *GREEDY, "--cap",
                         "images=column:images:16"], check=False)
    assert proc.returncode == 2 and "pack caps the measures of its sorted input (--cap images=16)" in proc.stderr
    proc = run_sortpack(["pack", tmp_path / "p.sorted", "-o", tmp_path / "q", *GREEDY, "--cap", "images=16"],
                        check=False)
    assert proc.returncode == 2 and "--cap images: these samples carry no measure 'images'" in proc.stderr


@pytest.mark.slow  # several whole jobs
def test_a_sample_over_a_cap_alone_follows_oversize(vl, tmp_path):
    path, s = vl
    over = int((s["images"] > 6).sum())
    args = ["run", path, "-o", tmp_path / "p", *GREEDY, "--size", "column:seq", "--cap", "images=column:images:6"]
    proc = run_sortpack(args, check=False)
    assert proc.returncode == 2 and f"{over} samples have images over its cap 6 alone (largest 8)" in proc.stderr
    run_sortpack([*args, "--oversize", "skip"])
    m = read_manifest(tmp_path / "p")
    assert m["stats"]["skipped"] == over and m["num_samples"] == len(s["seq"]) - over


def test_the_reader_hands_out_every_measure(vl, tmp_path):
    path, s = vl
    out = tmp_path / "plan"
    run_sortpack(["run", path, "-o", out, *THREE, *GREEDY, "--measure", "vit=column:patches"])
    assert PackedIndex(out).sum_columns == ("attention", "enc", "images", "vit")
    for mb in PackedSampler(out, rank=0, world_size=2):
        ids = list(mb)
        assert mb.measures == {"enc": int(s["img"][ids].sum()), "images": int(s["images"][ids].sum()),
                               "vit": int(s["patches"][ids].sum())}
        info = mb.info()
        assert {k: info[k] for k in mb.measures} == mb.measures and mb.size2 is None


@pytest.mark.slow
def test_balance_compute_balances_the_encoder_too(tmp_path):
    s = vl_set(100_000, seed=6)
    pq.write_table(pa.table(s), tmp_path / "vl.parquet")

    def plan(name, extra):
        run_sortpack(["run", tmp_path / "vl.parquet", "-o", tmp_path / name, *THREE, *GREEDY, *extra], timeout=600)
        t = table(tmp_path / name)
        ids = ids_of(t)
        seq = s["seq"].astype(np.float64)
        llm = np.array([(6144 * seq[i] + seq[i] ** 2).sum() for i in ids])
        enc = np.array([(7680 * s["patches"][i] + s["patches_sq"][i].astype(np.float64)).sum() for i in ids])
        report = json.loads(run_sortpack(["inspect", tmp_path / name, "--world-size", "8", "--json"]).stdout)
        return llm, enc, report

    llm, enc, report = plan("both", ENCODER)
    assert report["compute_imbalance"] == imbalance(step_costs(llm, 8, 1))  # inspect reports each cost apart
    assert report["encoder_imbalance"] == pytest.approx(imbalance(step_costs(enc, 8, 1)))
    llm_only, enc_only, _ = plan("llm", ["--balance", "compute"])
    for w in (8, 64):
        both = imbalance(step_costs(enc, w, 1))["p99"]
        assert both < imbalance(step_costs(enc_only, w, 1))["p99"]  # the LLM's order alone leaves the encoder's
    assert imbalance(step_costs(llm, 8, 1))["p99"] <= 1.05 and imbalance(step_costs(enc, 8, 1))["p99"] <= 1.05
    assert binding(table(tmp_path / "both")).mean() >= 0.98


@pytest.mark.slow
@pytest.mark.parametrize("layout", [GREEDY + ENCODER, ["--rows", str(SEQ), "--rows-per-microbatch", "2"] + ENCODER,
                                    GREEDY + ["--stages", "2", "--difficulty", "column:text"]],
                         ids=["greedy-encoder", "rows-encoder", "greedy-stages"])
def test_plans_are_the_same_at_any_rank_count(vl, tmp_path, layout):
    path, _ = vl
    # --segment-size: several packing pieces, owned by different ranks
    assert_same_at_ranks(["run", path, *THREE, *layout, "--segment-size", "1500"], tmp_path, timeout=300)
