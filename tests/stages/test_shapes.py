"""``--shapes auto:K`` and ``--static-shapes``: the global histogram, the chosen lengths in packing,
fixed batch sizes per length, the options, manifest and inspect lines, and the index end to end
(the DP itself: tests/kernels/test_lengths.py)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sortpack.errors import SortpackError
from sortpack.parallel import SerialComm
from sortpack.stages.pack import PackOptions, pack_samples, static_batch_size
from sortpack.stages.samples import SampleColumns
from sortpack.stages.shapes import choose_shapes, global_histogram, padded_total, parse_shapes

from support import assert_same_at_ranks, lognormal, rounding_padding, run_sortpack, write_text_parquet


# --- the global histogram ---------------------------------------------------------------------------
def test_histogram_dense_and_sparse_paths_agree():
    sizes = np.array([0, 3, 3, 70000, 5, 3, 70000, 1], np.int64)
    dense = global_histogram(SerialComm(), sizes)
    sparse = global_histogram(SerialComm(), sizes, dense_limit=1)
    for got in (dense, sparse):
        assert got[0].tolist() == [1, 3, 5, 70000] and got[1].tolist() == [2, 3, 1, 2]  # size 0 counts as 1
    assert [a.tolist() for a in global_histogram(SerialComm(), np.zeros(0, np.int64))] == [[], []]


def test_parse_shapes():
    assert parse_shapes("128,256") == ((128, 256), None)
    assert parse_shapes("auto:8") == ((), 8)
    assert parse_shapes("auto:0") == ((), 0)  # refused by PackOptions.validate, with its own message
    for bad in ("auto", "auto:x", "1,a"):
        with pytest.raises(SortpackError, match="--shapes"):
            parse_shapes(bad)


# --- packing ----------------------------------------------------------------------------------------
def pack(sizes, stage=None, **kw):
    sizes = np.asarray(sizes, np.int64)
    order = np.lexsort((np.arange(len(sizes)), sizes))
    samples = SampleColumns(0, len(sizes), order.astype(np.int64), sizes[order], sizes[order],
                      None if stage is None else np.asarray(stage, np.int16)[order])
    opts = PackOptions(**kw)
    mbs = pack_samples(SerialComm(), samples, opts)
    return opts.with_shapes(mbs.shapes), mbs  # the options as the packing applied them (auto:K's lengths)


def check_static(opts, mbs, n):
    c = mbs.columns
    ns, bs, ps = (c[x].astype(np.int64) for x in ("num_samples", "batch_size", "padded_size"))
    assert np.array_equal(np.sort(mbs.sample_ids), np.arange(n))  # every sample once, no repeats
    assert np.all(ns <= bs) and np.all(ns >= 1)
    assert np.array_equal(bs, static_batch_size(opts, ps))  # one batch size per length
    lengths = np.unique(ps)
    assert mbs.stats["distinct_shapes"] == len(lengths)
    assert np.all(c["max_size"] <= ps)
    return ns, bs, ps


@pytest.mark.parametrize("max_tokens", [16384, 65536])
def test_auto_static_on_lognormal_is_within_a_point_of_the_optimum(max_tokens):
    sizes = lognormal(200_000)
    opts, mbs = pack(sizes, max_tokens=max_tokens, auto_shapes=8, static_shapes=True)
    _, bs, ps = check_static(opts, mbs, len(sizes))
    assert mbs.stats["distinct_shapes"] <= 8 and len(opts.shapes) == 8
    assert np.all(bs * ps <= max_tokens)
    best = mbs.stats["auto_shapes"]["rounding_padding_ratio"]
    assert best == pytest.approx(rounding_padding(sizes, opts.shapes), abs=1e-12)
    assert best <= mbs.stats["padding_ratio"] <= best + 0.01
    assert opts.as_dict()["shapes"] == list(opts.shapes) and opts.as_dict()["shapes_request"] == "auto:8"
    assert opts.as_dict()["static_shapes"] is True


@pytest.mark.parametrize("kw", [
    {"max_tokens": 4000, "batch_multiple": 8},
    {"max_tokens": 4000, "max_samples": 5, "batch_multiple": 2},
    {"max_tokens": 30000, "budget": "quadratic", "quadratic_scale": 256.0},
    {"max_tokens": 4000, "budget": "tokens"},
])
def test_static_batch_sizes_respect_every_option(kw):
    sizes = lognormal(20_000, seed=3, maximum=1000)
    stage = np.arange(len(sizes)) % 2  # curriculum stages: more partial micro-batches
    opts, mbs = pack(sizes, stage=stage, auto_shapes=5, static_shapes=True, segment_size=3000, **kw)
    _, bs, ps = check_static(opts, mbs, len(sizes))
    assert len(np.unique(ps)) <= 5
    m = kw.get("batch_multiple", 1)
    assert np.all((bs % m == 0) | (bs < m))
    if kw.get("max_samples"):
        assert bs.max() <= kw["max_samples"]
    if kw.get("budget") == "quadratic":
        q = kw["quadratic_scale"]
        assert np.all(bs * (ps + ps.astype(np.float64) ** 2 / q) <= kw["max_tokens"])
    else:
        assert np.all(bs * ps <= kw["max_tokens"])
    if kw.get("budget") != "quadratic":
        # the batch size is the most that fits: one more multiple at that length would not
        more = bs + m
        assert np.all((more * ps > kw["max_tokens"]) | (more > (kw.get("max_samples") or more)))


@pytest.mark.parametrize("kw", [{"shapes": (64, 128, 256, 512, 1024)}, {"pad_to_multiple": 128}])
def test_static_shapes_with_listed_lengths_or_multiples(kw):
    sizes = lognormal(5000, seed=4, maximum=1000)
    opts, mbs = pack(sizes, max_tokens=8192, static_shapes=True, batch_multiple=4, **kw)
    _, bs, ps = check_static(opts, mbs, len(sizes))
    assert np.all((bs % 4 == 0) | (bs < 4)) and np.all(bs * ps <= 8192)
    if "shapes" in kw:
        assert set(ps.tolist()) <= set(kw["shapes"])
    else:
        assert np.all(ps % 128 == 0)
    # without --static-shapes the same packing has a batch size per micro-batch: more shapes
    _, plain = pack(sizes, max_tokens=8192, batch_multiple=4, **kw)
    assert plain.stats["distinct_shapes"] > mbs.stats["distinct_shapes"]


def test_auto_shapes_after_oversize_skip_and_truncate():
    sizes = [10, 20, 20, 30, 5000, 7000, 90]
    with pytest.raises(SortpackError, match="2 samples do not fit"):
        pack(sizes, max_tokens=100, auto_shapes=2)
    opts, mbs = pack(sizes, max_tokens=100, auto_shapes=2, oversize="skip")
    assert opts.shapes[-1] == 90 and mbs.stats["skipped"] == 2
    # truncated samples count at the largest length that fits alone: the budget here
    opts, mbs = pack(sizes, max_tokens=100, auto_shapes=2, static_shapes=True, oversize="truncate")
    assert opts.shapes == (30, 100) and mbs.stats["truncated"] == 2
    _, bs, ps = check_static(opts, mbs, len(sizes))
    assert dict(zip(ps.tolist(), bs.tolist())) == {30: 3, 100: 1}


def test_reusing_options_chooses_again_from_the_new_data():
    opts = PackOptions(max_tokens=10_000, auto_shapes=2)
    samples = SampleColumns(0, 3, np.arange(3), np.array([1, 2, 50]), np.array([1, 2, 50]))
    assert pack_samples(SerialComm(), samples, opts).shapes == (2, 50)
    samples = SampleColumns(0, 3, np.arange(3), np.array([7, 8, 8]), np.array([7, 8, 8]))
    assert pack_samples(SerialComm(), samples, opts).shapes == (7, 8)
    # options that carry lengths already (a plan's, recorded) choose again too
    assert pack_samples(SerialComm(), samples, opts.with_shapes((2, 50))).shapes == (7, 8)


def test_the_chosen_lengths_are_the_result_s_and_the_options_stay_read_only():
    opts = PackOptions(max_tokens=10_000, auto_shapes=2)
    samples = SampleColumns(0, 3, np.arange(3), np.array([1, 2, 50]), np.array([1, 2, 50]))
    mbs = pack_samples(SerialComm(), samples, opts)
    assert opts.shapes == () and opts.as_dict()["shapes"] == []  # the stage decided: its result says so
    assert mbs.shapes == (2, 50) and opts.with_shapes(mbs.shapes).as_dict()["shapes"] == [2, 50]
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.shapes = (1, 2)  # type: ignore[misc]
    # listed lengths are the result's too, so a reader of the result needs no options
    assert pack_samples(SerialComm(), samples, PackOptions(max_tokens=10_000, shapes=(64,))).shapes == (64,)


def test_choose_shapes_summary():
    lengths, info = choose_shapes(SerialComm(), np.array([1, 1, 2, 8]), 2)
    assert lengths == (2, 8)
    assert info == {"request": "auto:2", "lengths": [2, 8], "distinct_sizes": 3, "rounded_tokens": 14,
                    "rounding_padding_ratio": 1 - 12 / 14}


@pytest.mark.parametrize("bad,message", [
    ({"auto_shapes": 0}, "K must be >= 1"),
    ({"static_shapes": True}, "--static-shapes needs"),
    ({"static_shapes": True, "auto_shapes": 4, "same_shape": True, "group_size": 2}, "exclude each other"),
    ({"auto_shapes": 4, "pad_to_multiple": 8}, "exclude each other"),
    ({"max_tokens": None, "rows": 100, "auto_shapes": 4}, "--shapes auto does not apply"),
    ({"max_tokens": None, "rows": 100, "static_shapes": True, "pad_to_multiple": 8}, "does not apply"),
])
def test_bad_option_combinations_are_refused(bad, message):
    kw = {"max_tokens": 1000, **bad}
    with pytest.raises(SortpackError, match=message):
        PackOptions(**kw).validate()


# --- the command line ---------------------------------------------------------------------------------
SMALL = {"SORTPACK_TEST_SHARD_ROWS": "100"}


@pytest.fixture
def lognormal_dataset(tmp_path):
    sizes = lognormal(3000, seed=9, maximum=2000)
    files = [write_text_parquet(tmp_path / f"part-{k}.parquet", sizes[k * 1000:(k + 1) * 1000], 250)
             for k in range(3)]
    return files, sizes


def read_index(path):
    import pyarrow as pa

    m = json.loads((path / "manifest.json").read_text())
    return m, pa.concat_tables(pa.ipc.open_file(str(path / e["file"])).read_all() for e in m["shards"])


@pytest.mark.mpi
@pytest.mark.slow
def test_auto_static_is_byte_identical_for_1_to_4_ranks(tmp_path, lognormal_dataset):
    files, sizes = lognormal_dataset
    outs = assert_same_at_ranks(["run", *files, "--column", "text", "--max-tokens", "8000", "--shapes", "auto:8",
                                 "--static-shapes", "--segment-size", "700", "--quiet"], tmp_path, env=SMALL,
                                timeout=120)
    m, table = read_index(outs[0])
    assert len(m["shards"]) >= 2
    lengths = m["options"]["shapes"]
    assert m["options"]["shapes_request"] == "auto:8" and m["options"]["static_shapes"] is True
    assert len(lengths) == 8 and lengths[-1] == int(sizes.max())
    values, counts = np.unique(sizes, return_counts=True)
    assert padded_total(values, counts, lengths) == brute_force_free_optimum(values, counts, 8)
    shapes = set(zip(table["batch_size"].to_pylist(), table["padded_size"].to_pylist()))
    assert len(shapes) <= 8 and m["stats"]["distinct_shapes"] == len(shapes)
    # padding slots and shared lengths only add to per-sample rounding (the within-a-point check is the
    # 200k test above: here 3000 samples in segments of 700 leave many partial micro-batches)
    assert m["stats"]["padding_ratio"] >= m["stats"]["auto_shapes"]["rounding_padding_ratio"]
    # the separate pack stage gives the same index
    run_sortpack(["run", *files, "-o", tmp_path / "staged", "--column", "text", "--max-tokens", "8000",
                  "--keep-intermediate", "--quiet"])
    run_sortpack(["pack", tmp_path / "staged.sorted", "-o", tmp_path / "packed", "--max-tokens", "8000",
                  "--shapes", "auto:8", "--static-shapes", "--segment-size", "700", "--quiet"], ranks=3, env=SMALL)
    assert read_index(tmp_path / "packed")[1].equals(table)


def brute_force_free_optimum(values, counts, k):
    """The optimum by the plain O(k d^2) DP (independent of the kernel's divide and conquer)."""
    d = len(values)
    prefix = np.concatenate(([0], np.cumsum(counts)))
    f = values * prefix[1:]
    f = np.concatenate(([0], f))
    for _ in range(k - 1):
        g = f.copy()
        for i in range(1, d + 1):
            j = np.arange(i)
            g[i] = (f[j] + values[i - 1] * (prefix[i] - prefix[j])).min()
        f = g
    return int(f[d])


def test_inspect_prints_chosen_lengths_and_shapes(tmp_path, lognormal_dataset):
    files, _ = lognormal_dataset
    plan = tmp_path / "plan"
    run_sortpack(["run", *files, "-o", plan, "--column", "text", "--max-tokens", "8000", "--shapes", "auto:4",
                  "--static-shapes", "--quiet"])
    m, table = read_index(plan)
    text = run_sortpack(["inspect", plan]).stdout
    lengths = ",".join(map(str, m["options"]["shapes"]))
    assert f"auto:4: {lengths}" in text
    line = next(row for row in text.splitlines() if row.startswith("shapes "))
    want = sorted(set(zip(table["batch_size"].to_pylist(), table["padded_size"].to_pylist())))
    assert line.split()[1:1 + len(want)] == [f"{b}x{p}" for b, p in want]
    report = json.loads(run_sortpack(["inspect", plan, "--json"]).stdout)
    assert report["chosen_lengths"]["lengths"] == m["options"]["shapes"]
    assert report["shapes"] == [list(s) for s in want] and report["distinct_shapes"] == len(want) <= 4


@pytest.mark.parametrize("command", ["run", "pack"])
@pytest.mark.parametrize("args,message", [
    (["--shapes", "auto:0"], "K must be >= 1"),
    (["--shapes", "auto:x"], "auto:K"),
    (["--static-shapes"], "--static-shapes needs"),
    (["--shapes", "auto:4", "--static-shapes", "--same-shape", "--group-size", "2"], "exclude each other"),
    (["--shapes", "auto:4", "--rows", "512"], "does not apply"),
])
@pytest.mark.slow
def test_bad_shape_options_fail_with_one_line(tmp_path, lognormal_dataset, command, args, message):
    files, _ = lognormal_dataset
    if command == "pack":
        run_sortpack(["run", *files, "-o", tmp_path / "s0", "--column", "text", "--max-tokens", "8000",
                      "--keep-intermediate", "--quiet"])
        sorted_dir = tmp_path / "s0.sorted"
        cmd = ["pack", sorted_dir, "-o", tmp_path / "out", "--max-tokens", "8000", *args]
    else:
        cmd = ["run", *files, "-o", tmp_path / "out", "--column", "text", "--max-tokens", "8000", *args]
    proc = run_sortpack(cmd, check=False)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], \
        proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.torch
@pytest.mark.slow
def test_static_index_feeds_fixed_shapes_to_the_model(tmp_path, lognormal_dataset):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from sortpack.torch import PackedBatchSampler, SourceDataset, pad_collate

    files, sizes = lognormal_dataset
    plan = tmp_path / "plan"
    run_sortpack(["run", *files, "-o", plan, "--column", "text", "--max-tokens", "8000", "--shapes", "auto:4",
                  "--static-shapes", "--batch-multiple", "2", "--quiet"])
    sampler = PackedBatchSampler(str(plan), rank=0, world_size=1, order="shuffle", seed=1)
    loader = DataLoader(SourceDataset(str(plan), columns=["text"]), batch_sampler=sampler,
                        collate_fn=pad_collate(pad_id=0, tokenize=lambda row: np.frombuffer(row["text"].encode(),
                                                                                            np.uint8)))
    lengths = json.loads((plan / "manifest.json").read_text())["options"]["shapes"]
    seen, real = set(), 0
    for batch in loader:
        shape = tuple(batch["input_ids"].shape)
        seen.add(shape)
        assert shape[1] in lengths and shape[0] % 2 == 0
        n = int(batch["real"].sum())
        real += n
        assert batch["real"][:n].all() and not batch["real"][n:].any()  # padding slots come last
        assert (batch["lengths"][n:] == 0).all() and batch["key_padding_mask"][n:].all()
        assert torch.equal(batch["lengths"][:n], torch.as_tensor(sizes[batch["sample_ids"][:n].numpy()]))
    assert real == len(sizes) and len(seen) <= 4
