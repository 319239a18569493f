"""run/pack --store and --store-tokens: data shards in plan order, read back by SourceDataset."""
from __future__ import annotations

import json
import resource

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.format.data_shards import data_cuts
from sortpack.format.shards import verify_directory
from sortpack.reader import PackedIndex, SourceDataset
from sortpack.torch import PackedBatchSampler, pad_collate, varlen_collate

from support import assert_same_at_ranks, make_tokenizer, run_sortpack

# small index shards, cut by micro-batches and by samples, and small data shards
SMALL = {"SORTPACK_TEST_SHARD_ROWS": "40", "SORTPACK_TEST_SHARD_SAMPLES": "500", "SORTPACK_TEST_DATA_ROWS": "300"}
MODES = {
    "padded": [],
    "shapes": ["--shapes", "64,128,256,512", "--batch-multiple", "2"],
    "same-shape": ["--group-size", "4", "--same-shape", "--pad-to-multiple", "32"],
    "rows": ["--rows", "1024", "--rows-per-microbatch", "2", "--max-segments", "16"],
    "stages": ["--key", "difficulty", "--difficulty", "column:n*0.5", "--stages", "3", "--descending"],
    "skip": ["--max-tokens", "250", "--oversize", "skip"],
}


def manifest(d):
    return json.loads((d / "manifest.json").read_text())


def source_table(files) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in files])


def data_files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "manifest.json"}


def assert_rows_match(plan, src: pa.Table, world: int = 2):
    """Every micro-batch every rank gets holds exactly the source rows of its sample ids."""
    index = PackedIndex(plan)
    ds = SourceDataset(plan)
    assert ds.stored is not None
    seen = 0
    for rank in range(world):
        sampler = PackedBatchSampler(index, rank=rank, world_size=world, order="shuffle", seed=3)
        for mb in sampler:
            items = ds.__getitems__(mb)
            assert items.microbatch is mb
            want = src.select(ds.stored.columns).take(pa.array(list(mb), pa.int64())).to_pylist()
            assert list(items) == want
            seen += len(mb)
    assert seen >= index.num_samples


def assert_take_matches(plan, src: pa.Table, seed: int = 0):
    """Random ids (repeats, every shard, any order) read back by ``take`` as the source's rows; others refused."""
    stored = PackedIndex(plan).stored
    ids = stored.index.all_sample_ids()
    rng = np.random.default_rng(seed)
    for n in (0, 1, 7, 1000):
        want = rng.choice(ids, n)
        got = stored.take(want)
        assert got.column_names == stored.columns and got.num_rows == n
        assert got.to_pylist() == src.select(stored.columns).take(pa.array(want, pa.int64())).to_pylist()
    absent = np.setdiff1d(np.arange(src.num_rows), ids)
    for bad in [-1, src.num_rows, *absent[:1].tolist()]:
        with pytest.raises(KeyError, match=f"sample id {bad} "):
            stored.take([int(ids[0]), bad])


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.slow
def test_stored_rows_equal_the_source_in_every_mode(tmp_path, text_dataset, mode):
    files, _ = text_dataset
    plan = tmp_path / "plan"
    args = ["run", *files, "-o", plan, "--column", "text", "--max-tokens", "1500", "--segment-size", "700",
            "--quiet", "--store", "text,n", *MODES[mode]]
    run_sortpack(args, env=SMALL)
    m = manifest(plan)
    assert m["version"] == 2 and m["data"]["columns"] == ["text", "n"]
    assert len(m["data"]["shards"]) > 1
    assert verify_directory(plan) == []
    assert_rows_match(plan, source_table(files))
    assert_take_matches(plan, source_table(files))
    # the index shards are the plain index's: sampling, resume and world size behave the same
    plain = tmp_path / "plain"
    run_sortpack([a if a != plan else plain for a in args[:-(2 + len(MODES[mode]))]] + MODES[mode], env=SMALL)
    for e in manifest(plain)["shards"]:
        assert (plain / e["file"]).read_bytes() == (plan / e["file"]).read_bytes()
    assert manifest(plain)["version"] == 1


@pytest.mark.slow
def test_same_shape_padding_slots_collate_from_stored_rows(tmp_path, text_dataset):
    files, _ = text_dataset
    plan = tmp_path / "plan"
    run_sortpack(["run", *files, "-o", plan, "--column", "text", "--max-tokens", "1500", "--quiet",
                  "--group-size", "8", "--same-shape", "--store", "text"], env=SMALL)
    index = PackedIndex(plan)
    stored, plain = SourceDataset(plan), SourceDataset(plan, columns=["text", "n"])
    assert stored.stored is not None and plain.stored is None
    collate = pad_collate(key="text", tokenize=lambda r: r["text"].encode())
    padded = 0
    for mb in PackedBatchSampler(index, rank=0, world_size=1):
        a, b = collate(stored.__getitems__(mb)), collate(plain.__getitems__(mb))
        for k in a:
            same = a[k] == b[k]
            assert bool(same.all()) if hasattr(same, "all") else same, k
        padded += int((~a["real"]).sum())
    assert padded > 0  # the groups really have padding slots


def _words_dataset(tmp_path, n=600):
    rng = np.random.default_rng(5)
    words = np.array(["hello", "world", "the", "quick", "brown", "fox", "!", ","])
    texts = [" ".join(words[rng.integers(0, len(words), rng.integers(1, 60))]) for _ in range(n)]
    path = tmp_path / "words.parquet"
    pq.write_table(pa.table({"text": texts, "n": np.arange(n)}), path, row_group_size=100)
    return path, texts


@pytest.mark.slow
def test_store_tokens_are_the_counted_ids(tmp_path):
    path, texts = _words_dataset(tmp_path)
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    plan = tmp_path / "plan"
    run_sortpack(["run", path, "-o", plan, "--column", "text", "--size", "tokens", "--tokenizer", tok_path,
                  "--max-tokens", "400", "--quiet", "--keep-intermediate", "--store", "text", "--store-tokens"],
                 env=SMALL)
    m = manifest(plan)
    assert m["data"]["columns"] == ["text", "input_ids"] and m["data"]["schema"]["input_ids"] == "list<item: int32>"
    assert m["data"]["tokens"]["column"] == "input_ids"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    metrics = pa.concat_tables(pa.ipc.open_file(str(plan.parent / "plan.metrics" / e["file"])).read_all()
                               for e in manifest(plan.parent / "plan.metrics")["shards"])
    size = dict(zip(metrics["sample_id"].to_pylist(), metrics["size"].to_pylist()))
    index, ds = PackedIndex(plan), SourceDataset(plan)
    collate, vcollate = pad_collate(key="input_ids"), varlen_collate(key="input_ids")
    for mb in PackedBatchSampler(index, rank=0, world_size=1, order="shuffle"):
        items = ds.__getitems__(mb)
        for sid, row in zip(mb, items):
            assert row["input_ids"] == tok.encode(texts[sid]).ids
            assert len(row["input_ids"]) == size[sid] and row["text"] == texts[sid]
        batch = collate(items)
        ref = pad_collate(tokenize=lambda r: tok.encode(r["text"]).ids)(items)
        assert bool((batch["input_ids"] == ref["input_ids"]).all())
        assert batch["lengths"].tolist() == [size[s] for s in mb]
        assert vcollate(items)["cu_seqlens"][-1] == sum(size[s] for s in mb)

    # pack --store-tokens from the sorted directory gives the same bytes
    packed = tmp_path / "packed"
    run_sortpack(["pack", plan.parent / "plan.sorted", "-o", packed, "--max-tokens", "400", "--quiet",
                  "--store", "text", "--store-tokens", "--tokenizer", tok_path], env=SMALL)
    assert data_files(packed) == data_files(plan)


@pytest.mark.slow
def test_pack_store_and_a_changed_input_is_refused(tmp_path, text_dataset):
    files, _ = text_dataset
    run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500", "--quiet",
                  "--keep-intermediate", "--store", "text"], env=SMALL)
    out = tmp_path / "packed"
    run_sortpack(["pack", tmp_path / "plan.sorted", "-o", out, "--max-tokens", "1500", "--quiet",
                  "--store", "text"], env=SMALL)
    assert data_files(out) == data_files(tmp_path / "plan")
    # rewrite one input with other rows: same row count, other bytes
    t = pq.read_table(files[1])
    pq.write_table(t.set_column(0, "text", pa.array([s + "x" for s in t["text"].to_pylist()])), files[1],
                   row_group_size=250)
    proc = run_sortpack(["pack", tmp_path / "plan.sorted", "-o", out, "--max-tokens", "1500", "--overwrite",
                         "--store", "text"], env=SMALL, check=False)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(files[1]) in lines[0] and "changed since analyze" in lines[0], proc.stderr
    assert data_files(out) == data_files(tmp_path / "plan")  # the previous output is intact


@pytest.mark.parametrize("extra, message", [
    (["--store", "text,nope"], "no column 'nope'"),
    (["--store", "text", "--memory-limit", "400"], "does not fit the exchange budget"),
    (["--store", "text", "--memory-limit", "lots"], "--memory-limit 'lots'"),
    (["--store-tokens"], "--store-tokens stores the ids of --size tokens"),
])
def test_bad_store_options_fail_with_one_line(tmp_path, text_dataset, extra, message):
    files, _ = text_dataset
    out = tmp_path / "plan"
    proc = run_sortpack(["run", *files, "-o", out, "--column", "text", "--max-tokens", "1500", *extra],
                        check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists() and not list(tmp_path.glob(".plan*"))


def test_disk_full_leaves_the_previous_output(tmp_path, text_dataset):
    files, _ = text_dataset
    out = tmp_path / "plan"
    run_sortpack(["run", *files, "-o", out, "--column", "text", "--max-tokens", "1500", "--quiet"])
    before = data_files(out)
    import subprocess
    import sys

    from support import ROOT

    def small_files():  # writes past 64 KiB fail with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    proc = subprocess.run([sys.executable, "-m", "sortpack", "run", *map(str, files), "-o", str(out), "--column",
                           "text", "--max-tokens", "1500", "--overwrite", "--store", "text"],
                          capture_output=True, text=True, timeout=120, preexec_fn=small_files, check=False,
                          # no .pyc: one written under the 64 KiB limit is cut short and breaks later imports
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "SORTPACK_NO_MPI": "1",
                               "PYTHONDONTWRITEBYTECODE": "1"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "cannot write" in lines[0], proc.stderr
    assert data_files(out) == before and not list(tmp_path.glob(".plan*"))


@pytest.mark.mpi
@pytest.mark.slow
def test_stored_data_is_byte_identical_for_1_to_4_ranks_with_many_rounds(tmp_path, text_dataset):
    files, _ = text_dataset
    outs = assert_same_at_ranks(["run", *files, "--column", "text", "--max-tokens", "1500", "--quiet",
                                 "--store", "text,n", "--memory-limit", "64K"], tmp_path, env=SMALL)
    for out in outs:
        exchange = manifest(out)["provenance"]["exchange"]
        assert exchange["memory_limit"] == 64 << 10 and exchange["rounds"] >= 4  # many bounded rounds
    assert_rows_match(outs[0], source_table(files), world=3)


def test_data_cuts_are_fixed_global_counts():
    offsets = np.array([0, 3, 7, 10, 14, 20], dtype=np.int64)
    # one rank with everything, or the same micro-batches split at an index shard boundary
    whole = data_cuts(0, offsets, 0, [0], rows_per_shard=8)
    assert whole.tolist() == [0, 3, 5]  # rows 0..10 | 10..20: the first boundary at or past row 8 starts a shard
    split = data_cuts(0, offsets, 0, [0, 2, 4], rows_per_shard=8).tolist()
    assert split == [0, 2, 3, 4, 5]


def test_source_dataset_by_sample_id_on_a_stored_index(tmp_path, text_dataset):
    files, _ = text_dataset
    plan = tmp_path / "plan"
    run_sortpack(["run", *files, "-o", plan, "--column", "text", "--max-tokens", "1500", "--quiet",
                  "--store", "text"], env=SMALL)
    ds, src = SourceDataset(plan), source_table(files)
    for i in (0, 5, 699, 700, 2099):
        assert ds[i] == {"text": src["text"][i].as_py()}
    assert ds.__getitems__([7, 3, 2000]) == [{"text": src["text"][i].as_py()} for i in (7, 3, 2000)]


@pytest.mark.slow
def test_inspect_and_verify_know_the_data_shards(tmp_path, text_dataset):
    files, _ = text_dataset
    plan = tmp_path / "plan"
    run_sortpack(["run", *files, "-o", plan, "--column", "text", "--max-tokens", "1500", "--quiet",
                  "--store", "text"], env=SMALL)
    report = json.loads(run_sortpack(["inspect", plan, "--json"]).stdout)
    assert report["version"] == 2 and report["data"]["columns"] == "text" and report["data"]["rows"] == 2100
    assert run_sortpack(["verify", plan]).returncode == 0
    shard = plan / manifest(plan)["data"]["shards"][1]["file"]
    raw = bytearray(shard.read_bytes())
    raw[200] ^= 0xFF
    shard.write_bytes(bytes(raw))
    proc = run_sortpack(["verify", plan], check=False)
    assert proc.returncode == 1 and f"{shard.name}: sha256 mismatch" in proc.stderr


@pytest.mark.mpi
@pytest.mark.slow
def test_store_tokens_kept_from_analyze_are_identical_at_1_and_3_ranks(tmp_path):
    path, texts = _words_dataset(tmp_path, n=900)
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    outs = []
    for ranks in (1, 3):
        out = tmp_path / f"plan{ranks}"
        run_sortpack(["run", path, "-o", out, "--column", "text", "--size", "tokens", "--tokenizer", tok_path,
                      "--max-tokens", "400", "--quiet", "--store-tokens", "--memory-limit", "32K"],
                     ranks=ranks, env=SMALL, timeout=180)
        outs.append(out)
        assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # caches and spills removed
    assert data_files(outs[1]) == data_files(outs[0])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    ds = SourceDataset(outs[1])
    for mb in PackedBatchSampler(PackedIndex(outs[1]), rank=1, world_size=2, order="shuffle"):
        assert [r["input_ids"] for r in ds.__getitems__(mb)] == [tok.encode(texts[i]).ids for i in mb]


def _every_kind_table(n=900, seed=5) -> pa.Table:
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 40, n)
    null = rng.random(n) < 0.2
    return pa.table({
        "text": pa.array([None if z else "w" * int(x) for x, z in zip(k, null)], pa.string()),
        "ids": pa.array([list(range(int(x))) for x in k], pa.list_(pa.int32())),
        "holey": pa.array([[1, None] if x % 7 == 0 else [int(x)] for x in k], pa.list_(pa.int64())),
        "flag": pa.array([None if z else bool(x % 2) for x, z in zip(k, null)]),
        "meta": pa.array([{"a": int(x)} for x in k]),
        "when": pa.array(k.astype("datetime64[s]")),
        "n": pa.array(k + 1),
    })


def _every_kind_files(tmp_path) -> list:
    """Write ``_every_kind_table`` as two Parquet files (row groups of 100) and return their paths."""
    table = _every_kind_table()
    files = []
    for i, part in enumerate((table.slice(0, 400), table.slice(400))):
        files.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(part, files[-1], row_group_size=100)
    return files


@pytest.mark.mpi
@pytest.mark.slow
def test_pieces_under_the_offset_limit_give_the_unsplit_bytes_at_1_and_3_ranks(tmp_path):
    # SORTPACK_TEST_PIECE_BYTES lowers the 1 GiB piece (2 GiB of 32-bit offsets) to 300 bytes:
    # spills, received rounds, rows that stay and IPC streams all go in many pieces; the
    # data shards must not change by a byte
    files = _every_kind_files(tmp_path)
    args = ["--size", "column:n", "--max-tokens", "200", "--quiet", "--store", "text,ids,holey,flag,meta,when",
            "--memory-limit", "16K"]
    runs = {}
    for ranks, piece in ((1, None), (1, "300"), (3, "300")):
        out = tmp_path / f"plan{ranks}-{piece}"
        env = dict(SMALL, **({"SORTPACK_TEST_PIECE_BYTES": piece} if piece else {}))
        run_sortpack(["run", *files, "-o", out, *args], ranks=ranks, env=env, timeout=180)
        runs[ranks, piece] = out
        exchange = manifest(out)["provenance"]["exchange"]
        assert exchange["spills"] >= 2
        if piece:  # many pieces per spill file
            assert exchange["spill_batches"] >= 3 * exchange["spills"], exchange
        else:
            assert exchange["spill_batches"] == exchange["spills"], exchange
    whole = data_files(runs[1, None])
    assert data_files(runs[1, "300"]) == whole and data_files(runs[3, "300"]) == whole
    assert_rows_match(runs[3, "300"], source_table(files), world=2)


@pytest.mark.mpi
@pytest.mark.slow
def test_token_ids_in_pieces_give_the_unsplit_bytes_at_3_ranks(tmp_path):
    path, texts = _words_dataset(tmp_path, n=900)
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    outs = []
    for ranks, piece in ((1, None), (3, "256")):
        out = tmp_path / f"plan{ranks}"
        env = dict(SMALL, **({"SORTPACK_TEST_PIECE_BYTES": piece} if piece else {}))
        run_sortpack(["run", path, "-o", out, "--column", "text", "--size", "tokens", "--tokenizer", tok_path,
                      "--max-tokens", "400", "--quiet", "--store", "text", "--store-tokens",
                      "--memory-limit", "32K"], ranks=ranks, env=env, timeout=180)
        outs.append(out)
    assert manifest(outs[1])["provenance"]["exchange"]["spill_batches"] > \
        manifest(outs[1])["provenance"]["exchange"]["spills"]
    assert data_files(outs[1]) == data_files(outs[0])


@pytest.mark.mpi
@pytest.mark.slow
def test_columns_of_every_kind_with_nulls_move_identically_at_1_and_3_ranks(tmp_path):
    # strings and lists go as byte ranges; booleans, structs and lists with null values
    # take the IPC path; nulls everywhere; a small limit forces rounds and spills
    files = _every_kind_files(tmp_path)
    outs = assert_same_at_ranks(["run", *files, "--size", "column:n", "--max-tokens", "200", "--quiet",
                                 "--store", "text,ids,holey,flag,meta,when", "--memory-limit", "16K"], tmp_path,
                                ranks=(1, 3), env=SMALL)
    assert verify_directory(outs[0]) == []
    assert_rows_match(outs[0], source_table(files), world=2)
    assert_take_matches(outs[0], source_table(files))  # nulls, structs, lists with null values


@pytest.mark.mpi
def test_profile_reports_the_peak_rss_of_every_rank_and_the_limit(tmp_path, text_dataset):
    files, _ = text_dataset
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "1500",
                         "--store", "text", "--memory-limit", "64K", "--profile"], ranks=2, env=SMALL, timeout=180)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("peak RSS per rank (MiB):"))
    per_rank = [int(x) for x in line.split(":")[1].split(",")]
    assert len(per_rank) == 2 and all(x > 10 for x in per_rank)
    assert per_rank == [round(b / 2**20) for b in
                        manifest(tmp_path / "plan")["provenance"]["profile"]["peak_rss_bytes_per_rank"]]
    assert "--store: memory limit 0.1 MiB per rank" in proc.stdout and " spills" in proc.stdout
