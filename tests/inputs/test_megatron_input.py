"""Megatron datasets as an input format, read index-only: sortpack.inputs.megatron and inputs.megatron_data."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.errors import SortpackError
from sortpack.inputs import megatron
from sortpack.inputs.discover import expand_inputs
from sortpack.inputs.formats import file_columns, format_of, open_source, read_unit_rows, read_units
from sortpack.inputs.megatron_data import companion, companion_path, open_data

from megatron_files import labels_for, random_sequences, write_dataset
from support import assert_same_at_ranks, read_manifest, run_sortpack

SEQS = random_sequences(500, seed=3)


@pytest.fixture
def corpus(tmp_path):
    """One uint16 dataset of 500 sequences and its labels companion ``corpus_labels``."""
    idx = write_dataset(tmp_path / "corpus", SEQS)
    write_dataset(tmp_path / "corpus_labels", labels_for(SEQS), np.int32)
    return idx


def _lists(table: pa.Table, column: str = "input_ids") -> list[list[int]]:
    return table.column(column).to_pylist()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64], ids=str)
def test_reads_every_integer_dtype(tmp_path, dtype):
    info = np.iinfo(dtype)
    seqs = [[0, 1, int(info.max)], [int(info.max) - 1], [2, 3], []]
    idx = write_dataset(tmp_path / "d", seqs, dtype)
    src = open_source(str(idx), "megatron")
    assert src.unit_rows == [4] and src.unit_bytes == [6 * np.dtype(dtype).itemsize]
    table = read_units(src, 0, 1, None)
    assert table.column_names == ["input_ids"] and _lists(table) == seqs
    assert pa.types.is_list(table.schema.field(0).type)


def test_units_and_row_ranges(corpus, monkeypatch):
    monkeypatch.setattr(megatron, "UNIT_SEQUENCES", 128)
    src = open_source(str(corpus), "megatron")
    assert src.unit_rows == [128, 128, 128, 116] and src.num_units == 4
    assert _lists(read_units(src, 1, 3, ["input_ids"])) == [s.tolist() for s in SEQS[128:384]]
    assert _lists(read_unit_rows(src, 2, range(5, 9), None)) == [s.tolist() for s in SEQS[261:265]]


def test_the_bin_is_mapped_not_copied(corpus):
    table = read_units(open_source(str(corpus), "megatron"), 0, 1, None)
    data = open_data(str(corpus))
    values = table.column(0).chunk(0).values
    assert values.buffers()[1].address == data.mapped_bin().__array_interface__["data"][0]


def test_gather_cuts_and_orders(corpus):
    data = open_data(str(corpus))
    ids = np.array([7, 2, 7, 400])
    values, offsets = data.gather(ids, begin=np.array([0, 1, 2, 0]), end=np.array([3, 99, 4, 1]))
    want = [SEQS[7][:3], SEQS[2][1:], SEQS[7][2:4], SEQS[400][:1]]
    assert [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == [w.tolist() for w in want]


def test_discovery_by_extension_directory_and_glob(tmp_path):
    for name in ("b", "a"):
        write_dataset(tmp_path / "shards" / name if (tmp_path / "shards").exists() else
                      _mkdir(tmp_path / "shards") / name, [[1, 2]])
    assert format_of("x/corpus_text_document.idx") == "megatron"
    found = expand_inputs([str(tmp_path / "shards")])
    assert [Path(p.path).name for p in found] == ["a.idx", "b.idx"] and {p.format for p in found} == {"megatron"}
    assert [Path(p.path).name for p in expand_inputs([str(tmp_path / "shards" / "*.idx")])] == ["a.idx", "b.idx"]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_companion_paths():
    assert companion_path("/d/corpus.idx", "{}_labels") == "/d/corpus_labels.idx"
    assert companion_path("/d/corpus.idx", "labels/{}.idx") == "/d/labels/corpus.idx"
    assert companion_path("/d/corpus.idx", "/e/lab") == "/e/lab.idx"
    assert companion_path("s3://b/d/corpus.idx", "{}_labels") == "s3://b/d/corpus_labels.idx"


def test_companion_must_match_the_lengths(corpus, tmp_path):
    data = open_data(str(corpus))
    assert companion(data, "{}_labels").num_sequences == 500
    write_dataset(tmp_path / "short", SEQS[:499])
    with pytest.raises(SortpackError, match="do not match .*corpus.idx's one for one"):
        companion(data, "short")
    with pytest.raises(SortpackError, match="no labels dataset .*nope.idx"):
        companion(data, "nope")
    table = read_units(open_source(str(corpus), "megatron"), 0, 1, ["input_ids", "{}_labels"])
    assert _lists(table, "{}_labels") == [v.tolist() for v in labels_for(SEQS)]
    assert file_columns(open_source(str(corpus), "megatron")) == ["input_ids"]


DAMAGES = [
    (lambda p: p.with_suffix(".idx").write_bytes(b"NOTMEGA" + p.with_suffix(".idx").read_bytes()[7:]),
     "not a Megatron index"),
    (lambda p: _patch(p.with_suffix(".idx"), 9, (3).to_bytes(8, "little")), "Megatron index version 3"),
    (lambda p: _patch(p.with_suffix(".idx"), 17, bytes([11])), "unknown dtype code 11"),
    (lambda p: p.with_suffix(".bin").write_bytes(p.with_suffix(".bin").read_bytes()[:-2]),
     r"corpus.bin: \d+ bytes, but sequence \d+ of the index ends at byte"),
    (lambda p: p.with_suffix(".bin").unlink(), "corpus.bin: missing"),
]


@pytest.mark.parametrize("damage, message", DAMAGES, ids=[m for _, m in DAMAGES])
def test_a_bad_dataset_is_refused_in_one_line(corpus, damage, message):
    damage(corpus)
    with pytest.raises(SortpackError, match=message) as err:
        open_source(str(corpus), "megatron")
    assert "\n" not in str(err.value) and str(corpus.with_suffix("")) in str(err.value)


@pytest.mark.parametrize("damage, message", [DAMAGES[0], pytest.param(*DAMAGES[3], marks=pytest.mark.slow)],
                         ids=["magic", "short bin"])
def test_a_bad_dataset_is_one_line_exit_2_nothing_written(corpus, tmp_path, damage, message):
    damage(corpus)
    proc = run_sortpack(["run", corpus, "-o", tmp_path / "plan", "--max-tokens", "512"], check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "plan").exists()


def _patch(path: Path, at: int, raw: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[at:at + len(raw)] = raw
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_size_tokens_needs_no_tokenizer_for_megatron_only(corpus, tmp_path):
    run_sortpack(["run", corpus, "-o", tmp_path / "plan", "--size", "tokens", "--max-tokens", "512", "--quiet"])
    manifest = read_manifest(tmp_path / "plan")
    assert manifest["options"]["size"] == "tokens" and manifest["stats"]["tokens"] == sum(len(s) for s in SEQS)
    pq.write_table(pa.table({"input_ids": [s.tolist() for s in SEQS]}), tmp_path / "ids.parquet")
    proc = run_sortpack(["run", tmp_path / "ids.parquet", "-o", tmp_path / "p2", "--size", "tokens",
                         "--max-tokens", "512"], check=False)
    assert proc.returncode == 2 and "--size tokens needs --tokenizer" in proc.stderr


def _index_shards(plan: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(plan.glob("microbatches-*.arrow"))}


SLOW_EXTRAS = (["--rows", "512"], ["--oversize", "split", "--max-tokens", "200"],
               ["--oversize", "truncate", "--max-tokens", "200"])


@pytest.mark.parametrize("extra", [[], *(pytest.param(e, marks=pytest.mark.slow) for e in SLOW_EXTRAS)], ids=str)
def test_the_plan_of_a_dataset_is_the_plan_of_the_same_ids_in_parquet(corpus, tmp_path, extra):
    # the same token ids as a Parquet list column: the same micro-batches (the index shards byte for byte)
    pq.write_table(pa.table({"input_ids": [s.tolist() for s in SEQS]}), tmp_path / "ids.parquet")
    opts = ["--max-tokens", "512", *extra, "--quiet"]
    run_sortpack(["run", corpus, "-o", tmp_path / "mg", *opts])
    run_sortpack(["run", tmp_path / "ids.parquet", "-o", tmp_path / "pq", *opts])
    assert _index_shards(tmp_path / "mg") == _index_shards(tmp_path / "pq")
    files = read_manifest(tmp_path / "mg")["source"]["files"]
    assert files[0]["format"] == "megatron" and files[0]["rows"] == 500 and files[0]["sha256_of"] == "file"


def test_labels_from_a_second_prefix(corpus, tmp_path):
    run_sortpack(["run", corpus, "-o", tmp_path / "plan", "--labels-column", "{}_labels", "--max-tokens", "512",
                  "--quiet"])
    manifest = read_manifest(tmp_path / "plan")
    assert manifest["options"]["fine_tune"] == {"shape": "labels", "labels_column": "{}_labels"}
    # a target is a label that a position predicts: none at a sequence's first token
    assert manifest["stats"]["targets"] == sum(int((lab[1:] != -100).sum()) for lab in labels_for(SEQS))
    proc = run_sortpack(["run", corpus, "-o", tmp_path / "p2", "--labels-column", "nope", "--max-tokens", "512"],
                        check=False)
    assert proc.returncode == 2 and "no labels dataset" in proc.stderr and not (tmp_path / "p2").exists()


@pytest.mark.slow
def test_store_tokens_and_store_input_ids_copy_the_ids(corpus, tmp_path):
    from sortpack.reader import PackedIndex

    run_sortpack(["run", corpus, "-o", tmp_path / "a", "--size", "tokens", "--store-tokens", "--max-tokens", "512",
                  "--labels-column", "{}_labels", "--quiet"])
    run_sortpack(["run", corpus, "-o", tmp_path / "b", "--store", "input_ids", "--max-tokens", "512", "--quiet"])
    a, b = PackedIndex(tmp_path / "a"), PackedIndex(tmp_path / "b")
    assert a.stored.columns == ["input_ids", "labels"] and b.stored.columns == ["input_ids"]
    assert a.manifest["data"]["tokens"]["tokenizer"] is None
    for index in (a, b):
        table = index.stored.microbatch(0)
        ids = index.microbatch(0).tolist()
        assert table.column("input_ids").to_pylist() == [SEQS[i].tolist() for i in ids]
        assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    lab = a.stored.microbatch(0).column("labels").to_pylist()
    assert lab == [labels_for(SEQS)[i].tolist() for i in a.microbatch(0).tolist()]


@pytest.mark.slow
def test_a_mixture_of_megatron_sources(corpus, tmp_path):
    other = write_dataset(tmp_path / "code", random_sequences(300, seed=9))
    spec = {"sources": [{"name": "web", "inputs": [str(corpus)], "weight": 0.7},
                        {"name": "code", "inputs": [str(other)], "weight": 0.3}]}
    (tmp_path / "mix.json").write_text(json.dumps(spec))
    run_sortpack(["run", "--mixture", tmp_path / "mix.json", "-o", tmp_path / "plan", "--max-tokens", "512",
                  "--quiet"])
    run_sortpack(["run", "--blend", f"70 {corpus} 30 {other}", "-o", tmp_path / "blend", "--max-tokens", "512",
                  "--quiet"])
    for plan in ("plan", "blend"):
        manifest = read_manifest(tmp_path / plan)
        assert [f["format"] for f in manifest["source"]["files"]] == ["megatron", "megatron"]
        assert manifest["num_samples"] > 0


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--labels-column", "{}_labels", "--rows", "512"],
                                   ["--size", "tokens", "--store-tokens", "--oversize", "split"]], ids=str)
def test_plans_of_megatron_inputs_are_the_same_at_1_to_4_ranks(corpus, tmp_path, extra):
    # two files, so ranks read parts of each; small shards, so every rank writes
    second = write_dataset(corpus.parent / "more", random_sequences(700, seed=5))
    write_dataset(corpus.parent / "more_labels", labels_for(random_sequences(700, seed=5)), np.int32)
    env = {"SORTPACK_TEST_SHARD_SAMPLES": "64", "SORTPACK_TEST_DATA_ROWS": "100"}
    assert_same_at_ranks(["run", corpus, second, "--max-tokens", "300", *extra, "--quiet"], tmp_path / "out",
                         env=env)


@pytest.mark.slow
def test_objects_plan_as_local_files(corpus, s3_server, tmp_path):
    # an s3:// prefix of datasets: the same plan as the local files
    s3_server.bucket("megatron")
    s3_server.upload_tree(corpus.parent, "s3://megatron/d")
    opts = ["--max-tokens", "512", "--labels-column", "{}_labels", "--quiet"]
    run_sortpack(["run", corpus, "-o", tmp_path / "local", *opts], env=s3_server.env())
    run_sortpack(["run", "s3://megatron/d/corpus.idx", "-o", tmp_path / "obj", *opts], env=s3_server.env(),
                 timeout=240)
    assert read_manifest(tmp_path / "local")["content_hash"] == read_manifest(tmp_path / "obj")["content_hash"]
    assert _index_shards(tmp_path / "local") == _index_shards(tmp_path / "obj")
