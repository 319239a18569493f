"""sortpack.reader.index: opening indexes the real pipeline wrote, in every packing mode."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sortpack.errors import SortpackError
from sortpack.reader import PackedIndex, PackedSampler

from reader_fixtures import pipeline_index, write_index
from support import greedy_oracle, run_sortpack, write_text_parquet

MODES = {
    "padded": {"max_tokens": 600},
    "tokens": {"max_tokens": 600, "budget": "tokens"},
    "quadratic": {"max_tokens": 900, "budget": "quadratic", "quadratic_scale": 64.0},
    "pad-to-multiple": {"max_tokens": 640, "pad_to_multiple": 32},
    "shapes": {"max_tokens": 800, "shapes": (64, 128, 256)},
    "same-shape": {"max_tokens": 600, "group_size": 3, "same_shape": True},
    "rows": {"max_tokens": 512, "rows": 256, "rows_per_microbatch": 2},
    "stages": {"max_tokens": 600, "stages": 3},
}


def _shard_ids(path: Path) -> list[list[int]]:
    manifest = json.loads((path / "manifest.json").read_text())
    out = []
    for entry in manifest["shards"]:
        with pa.memory_map(str(path / entry["file"])) as src:
            out.extend(pa.ipc.open_file(src).read_all().column("sample_ids").to_pylist())
    return out


def test_open_exposes_counts_columns_and_zero_copy_ids(small64):
    small = small64  # an int64 index: its ids are handed out as zero-copy views
    ix = PackedIndex(small)
    assert ix.id_dtype == np.int64
    assert ix.num_microbatches == 23 and len(ix._shards) == 5
    counts = ix["num_samples"]
    assert counts.dtype == np.int32 and len(counts) == 23 and ix.num_samples == counts.sum()
    want = _shard_ids(small)  # read independently, with pyarrow, across shard boundaries
    for i in range(23):
        ids = ix.microbatch(i)
        assert ids.dtype == np.int64 and not ids.flags.owndata and not ids.flags.writeable
        assert ids.tolist() == want[i]
    for name in ("max_size", "padded_size", "tokens", "batch_size", "stage"):
        assert len(ix[name]) == 23
        assert ix.take(name, [22, 0, 7]).tolist() == ix[name][[22, 0, 7]].tolist()
    assert ix.range_sum("tokens", 3, 19) == ix["tokens"][3:19].sum()
    with pytest.raises(IndexError):
        ix.microbatch(23)


def test_int32_ids_are_handed_out_as_int64(small, small64):
    """A small input's index stores int32 ids; the reader hands out the same int64 values as an int64 index's."""
    ix, ix64 = PackedIndex(small), PackedIndex(small64)
    assert ix.manifest["schema"]["sample_ids"] == "list<item: int32>"
    assert ix64.manifest["schema"]["sample_ids"] == "list<item: int64>"
    assert ix.id_dtype == np.int32 and ix64.id_dtype == np.int64
    want = _shard_ids(small)
    assert want == _shard_ids(small64)
    for i in range(23):
        ids = ix.microbatch(i)
        assert ids.dtype == np.int64 and not ids.flags.writeable
        assert ids.tolist() == want[i] == ix64.microbatch(i).tolist()
        got, bs, ps, splits = ix.record(i)
        assert (got, bs, ps, splits) == ix64.record(i)
        assert all(type(x) is int for x in got)
    # the id width is the only difference: same columns, same micro-batches, smaller shards
    for name in ("num_samples", "batch_size", "padded_size", "tokens", "min_key", "max_key"):
        assert ix[name].tolist() == ix64[name].tolist()
    assert sum(e["bytes"] for e in ix.manifest["shards"]) < sum(e["bytes"] for e in ix64.manifest["shards"])


def test_refuses_unknown_version_and_bad_shard_size(small, tmp_path):
    manifest = json.loads((small / "manifest.json").read_text())
    bad = tmp_path / "v2"
    bad.mkdir()
    for f in small.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "manifest.json").write_text(json.dumps({**manifest, "version": 3}))
    with pytest.raises(SortpackError, match="version 3 is not supported"):
        PackedIndex(bad)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with open(bad / manifest["shards"][1]["file"], "ab") as fh:
        fh.write(b"x")
    with pytest.raises(SortpackError, match="bytes, the manifest says"):
        PackedIndex(bad)


def _edited_copy(src: Path, dst: Path, edit) -> Path:
    """Return ``dst``: a copy of the plan ``src`` whose manifest ``edit(manifest)`` changed in place."""
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((src / "manifest.json").read_text())
    edit(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


# shard lists that do not tile their rows: a gap, an overlap, all moved off 0, one shard missing
UNTILED = {
    "gap": lambda shards: shards[1].update(first=shards[1]["first"] + 1),
    "overlap": lambda shards: shards[1].update(first=shards[1]["first"] - 1),
    "off-zero": lambda shards: [s.update(first=s["first"] + 1) for s in shards],
    "missing": lambda shards: shards.pop(),
}


@pytest.fixture(scope="module")
def stored_plan(tmp_path_factory):
    """A plan with its texts stored in several data shards (``--store text``)."""
    root = tmp_path_factory.mktemp("stored")
    write_text_parquet(root / "data.parquet", np.random.default_rng(2).integers(1, 60, size=120))
    run_sortpack(["run", root / "data.parquet", "-o", root / "plan", "--column", "text", "--max-tokens", "200",
                  "--store", "text", "--quiet"], env={"SORTPACK_TEST_DATA_ROWS": "40"})
    return root / "plan"


@pytest.mark.parametrize("how", sorted(UNTILED))
def test_refuses_index_and_data_shards_that_do_not_tile(small, stored_plan, tmp_path, how):
    """The index's shards and its stored data's are checked by one rule: consecutive from 0 to the count."""
    bad = _edited_copy(small, tmp_path / "index", lambda m: UNTILED[how](m["shards"]))
    with pytest.raises(SortpackError, match="manifest shards do not tile its 23 micro-batches"):
        PackedIndex(bad)
    assert len(json.loads((stored_plan / "manifest.json").read_text())["data"]["shards"]) >= 3
    bad = _edited_copy(stored_plan, tmp_path / "stored", lambda m: UNTILED[how](m["data"]["shards"]))
    index = PackedIndex(bad)  # its own shards tile: the stored data is opened when first asked for
    with pytest.raises(SortpackError, match="manifest shards do not tile its 120 stored rows"):
        _ = index.stored


def test_the_boolean_verify_spellings_are_refused_with_the_level_to_write(small):
    """``verify=True/False`` are refused spellings of ``"full"``/``"index"``: one line names the level."""
    assert PackedIndex(small, verify="full").verify == "full"
    with pytest.raises(ValueError, match="verify=True: the levels are 'structure', 'index', 'full'; "
                                         "write verify='full'"):
        PackedIndex(small, verify=True)
    with pytest.raises(ValueError, match="write verify='index'"):
        PackedIndex(small, verify=False)


@pytest.mark.parametrize("schema", [{"sample_ids"}, "sample_ids:list<item: int16>", None])
def test_a_manifest_must_say_how_the_ids_are_stored(small, tmp_path, schema):
    """The id width comes from the manifest's schema, never guessed from a shard."""
    manifest = json.loads((small / "manifest.json").read_text())
    bad = tmp_path / "no-width"
    bad.mkdir()
    for f in small.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    if schema is None:
        del manifest["schema"]
        match = "the manifest's schema lacks column"
    elif isinstance(schema, set):
        del manifest["schema"]["sample_ids"]
        match = "the manifest's schema lacks column\\(s\\) sample_ids"
    else:
        manifest["schema"]["sample_ids"] = schema.split(":", 1)[1]
        match = "gives sample_ids as 'list<item: int16>', not list<item: int32> or list<item: int64>"
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SortpackError, match=match):
        PackedIndex(bad)


def test_open_reads_a_small_fraction_of_a_large_index(tmp_path):
    smaps = Path("/proc/self/smaps")
    if not smaps.exists():
        pytest.skip("needs /proc/self/smaps")
    rng = np.random.default_rng(1)
    counts = rng.integers(1, 16, size=200_000)  # hand-written: 200 000 micro-batches in a second
    path = write_index(tmp_path / "big", counts, sizes=rng.integers(1, 1000, size=int(counts.sum())))
    # the default level reads every id once (hash, range); "structure" reads O(micro-batches)
    ix = PackedIndex(path, verify="structure")
    for entry in ix.manifest["shards"]:  # map every shard and read a little of each
        ix.microbatch(entry["first"] + 5), ix.shape(entry["first"] + 5)
    root, touched, current = str(path.resolve()), 0, None
    for line in smaps.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and "-" in parts[0] and not parts[0].endswith(":"):
            current = parts[5] if len(parts) > 5 else ""
        elif parts and parts[0] == "Rss:" and current and current.startswith(root):
            touched += int(parts[1]) * 1024
    total = sum(f.stat().st_size for f in path.iterdir())
    # what "structure" reads: the ids' list offsets and num_samples (8 bytes per micro-batch,
    # about 6% of this index of tiny micro-batches), not the ids
    assert touched < 0.15 * total, (touched, total)


def test_padded_index_is_the_greedy(tmp_path):
    lengths = np.random.default_rng(3).integers(1, 200, size=400)
    ix = PackedIndex(pipeline_index(tmp_path / "ix", lengths, max_tokens=600))
    order = np.lexsort((np.arange(len(lengths)), lengths))
    want = [[int(order[j]) for j in b] for b in greedy_oracle(lengths[order].tolist(), 600)]
    assert [ix.microbatch(i).tolist() for i in range(len(ix))] == want


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_packing_mode_reads_back_whole(tmp_path, mode):
    opts = dict(MODES[mode])
    stages = opts.pop("stages", 1)
    lengths = np.random.default_rng(len(mode)).integers(1, 200, size=300)
    ix = PackedIndex(pipeline_index(tmp_path / "ix", lengths, stages=stages, rows_per_shard=7, **opts))
    seen = []
    # many micro-batches read at once (shuffled, repeated, across shards) give each one's record
    picks = np.random.default_rng(1).integers(0, len(ix), size=2 * len(ix))
    assert ix.records(picks) == [ix.record(int(i)) for i in picks] and ix.records([]) == []
    with pytest.raises(IndexError, match="out of range"):
        ix.records([0, len(ix)])
    for i in range(len(ix)):
        ids, bs, ps, splits = ix.record(i)
        assert (bs, ps) == ix.shape(i) and ids == ix.microbatch(i).tolist()
        assert max(lengths[ids]) <= ps
        if mode == "rows":  # every row of a rows-mode micro-batch holds samples: no padding rows
            assert len(splits) == bs + 1 and splits[0] == 0 and splits[-1] == len(ids)
            assert np.all(np.diff(splits) > 0)
            assert all(lengths[ids[a:b]].sum() <= ps for a, b in itertools.pairwise(splits))
        else:
            assert splits is None and len(ids) <= bs and (bs == len(ids) or mode == "same-shape")
        seen.extend(ids)
    assert sorted(seen) == list(range(300))
    ps = ix["padded_size"]
    if mode == "pad-to-multiple":
        assert np.all(ps % 32 == 0)
    if mode == "shapes":
        assert set(ps.tolist()) <= {64, 128, 256}
    if mode == "same-shape":
        shape = np.stack([ix["batch_size"], ps], axis=1)
        groups = shape[:len(ix) // 3 * 3].reshape(-1, 3, 2)
        assert np.all(groups == groups[:, :1])
    if mode == "stages":
        assert np.all(np.diff(ix["stage"]) >= 0) and len(set(ix["stage"].tolist())) == 3
    # the sampler covers every micro-batch of every mode
    group = 3 if mode == "same-shape" else 1
    ranks = [PackedSampler(ix, rank=r, world_size=group, grad_accum=2) for r in range(group)]
    assert set(np.concatenate([s.schedule().ravel() for s in ranks]).tolist()) == set(range(len(ix)))


@pytest.mark.parametrize("shard_rows", [None, 4])
def test_records_of_one_shard_and_of_many_are_each_micro_batch_s_record(tmp_path, shard_rows):
    lengths = np.random.default_rng(5).integers(1, 200, size=120)
    ix = PackedIndex(pipeline_index(tmp_path / "ix", lengths, max_tokens=512, rows=256, rows_per_microbatch=2,
                                    rows_per_shard=shard_rows))
    assert (len(ix._shards) == 1) == (shard_rows is None)
    picks = np.random.default_rng(2).permutation(np.repeat(np.arange(len(ix)), 2))
    assert ix.records(picks) == [ix.record(int(i)) for i in picks]
    assert ix.records(picks[:1]) == [ix.record(int(picks[0]))]


@pytest.mark.parametrize("fixture", ["small", "small64"])
def test_all_sample_ids_is_every_microbatch_in_plan_order(fixture, request):
    # one concatenation of the shards' values, for the stored data's id -> row map
    path = request.getfixturevalue(fixture)
    ix = PackedIndex(path)
    flat = ix.all_sample_ids()
    assert flat.dtype == np.int64 and len(ix._shards) > 1
    assert flat.tolist() == [s for i in range(ix.num_microbatches) for s in ix.microbatch(i).tolist()]
