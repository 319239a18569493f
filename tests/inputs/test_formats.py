"""One reader per input format: sortpack.inputs.formats."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.errors import SortpackError
from sortpack.inputs import columnar_formats, formats, text_formats
from sortpack.inputs.formats import file_columns, format_names, format_of, open_source, read_unit_rows, read_units


def write_parquet(path, table, row_group_size=None):
    """Write ``table`` as Parquet (row groups of ``row_group_size`` rows) and return the path."""
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return str(path)


def write_arrow_file(path, table, batch_rows):
    """Write ``table`` as an Arrow IPC file of ``batch_rows``-row batches and return the path."""
    with pa.ipc.new_file(str(path), table.schema) as w:
        for b in table.to_batches(max_chunksize=batch_rows):
            w.write_batch(b)
    return str(path)


def write_arrow_stream(path, table, batch_rows):
    """Write ``table`` as an Arrow IPC stream of ``batch_rows``-row batches and return the path."""
    with pa.ipc.new_stream(str(path), table.schema) as w:
        for b in table.to_batches(max_chunksize=batch_rows):
            w.write_batch(b)
    return str(path)


def write_jsonl(path, rows):
    """Write dicts as JSON lines and return the path."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(path)


def write_csv(path, header, rows):
    """Write a CSV file from a header and rows of already-formatted cells; return the path."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(",".join(header) + "\n")
        for r in rows:
            fh.write(",".join(str(c) for c in r) + "\n")
    return str(path)


TEXT = pa.table({"text": ["a", "bb", "ccc", "dddd", "eeeee", "ffffff", "g"], "n": [1, 2, 3, 4, 5, 6, 7]})


def touch(path):
    """Create an empty file (and its directory) and return the path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return str(path)


# --- open_source -----------------------------------------------------------------------


def test_open_source_parquet_row_groups(tmp_path):
    src = open_source(write_parquet(tmp_path / "a.parquet", TEXT, row_group_size=3), "parquet")
    assert src.unit_rows == [3, 3, 1] and src.num_units == 3
    assert src.bytes == os.path.getsize(tmp_path / "a.parquet")
    assert src.fingerprint(7) == {"path": src.path, "format": "parquet", "rows": 7, "bytes": src.bytes}


def test_open_source_arrow_file_batches(tmp_path):
    src = open_source(write_arrow_file(tmp_path / "a.arrow", TEXT, 2), "arrow")
    assert src.unit_rows == [2, 2, 2, 1]


def test_open_source_arrow_stream_is_one_unit(tmp_path):
    src = open_source(write_arrow_stream(tmp_path / "a.arrow", TEXT, 2), "arrow")
    assert src.unit_rows is None and src.num_units == 1


def test_open_source_text_formats_are_one_unit(tmp_path):
    j = open_source(write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}]), "jsonl")
    c = open_source(write_csv(tmp_path / "a.csv", ["text"], [["x"]]), "csv")
    assert j.unit_rows is None and c.unit_rows is None and j.num_units == c.num_units == 1


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_open_source_garbage_names_file_and_format(tmp_path, fmt):
    p = tmp_path / f"bad.{fmt}"
    p.write_bytes(b"this is not a " + fmt.encode() + b" file" * 20)
    with pytest.raises(SortpackError, match=rf"bad\.{fmt}: cannot read as {fmt}"):
        open_source(str(p), fmt)


# --- read_units ---------------------------------------------------------------------


def test_read_parquet_row_groups(tmp_path):
    src = open_source(write_parquet(tmp_path / "a.parquet", TEXT, row_group_size=3), "parquet")
    t = read_units(src, 1, 3, ["text"])
    assert t.column_names == ["text"] and t.column("text").to_pylist() == TEXT["text"].to_pylist()[3:]


def test_read_arrow_file_batches(tmp_path):
    src = open_source(write_arrow_file(tmp_path / "a.arrow", TEXT, 2), "arrow")
    assert read_units(src, 1, 3, ["n"]).column("n").to_pylist() == [3, 4, 5, 6]
    assert read_units(src, 0, 4, None).equals(TEXT)


def test_read_arrow_stream_whole(tmp_path):
    src = open_source(write_arrow_stream(tmp_path / "a.arrows", TEXT, 2), "arrow")
    assert read_units(src, 0, 1, ["text", "n"]).equals(TEXT)


def test_read_jsonl_and_csv(tmp_path):
    j = open_source(write_jsonl(tmp_path / "a.jsonl", [{"text": "héllo", "n": 1}, {"text": "x y", "n": 2}]), "jsonl")
    assert read_units(j, 0, 1, ["text"]).column("text").to_pylist() == ["héllo", "x y"]
    c = open_source(write_csv(tmp_path / "a.csv", ["text", "n"], [["héllo", 1], ["x y", 2]]), "csv")
    t = read_units(c, 0, 1, ["n"])
    assert t.column_names == ["n"] and t.column("n").to_pylist() == [1, 2]


def test_csv_text_column_stays_text(tmp_path):
    # digits would otherwise be guessed as integers, losing the leading zeros
    c = open_source(write_csv(tmp_path / "a.csv", ["text"], [["00123"], ["45"]]), "csv")
    t = read_units(c, 0, 1, ["text"], text_columns=["text"])
    assert t.column("text").to_pylist() == ["00123", "45"]


def test_jsonl_type_widens_across_blocks(tmp_path):
    # the first block (1 MiB) sees only integers, a later one a float
    rows = [{"text": "w" * 100, "n": 1}] * 12000 + [{"text": "x", "n": 1.5}]
    src = open_source(write_jsonl(tmp_path / "a.jsonl", rows), "jsonl")
    assert src.bytes > 1 << 20
    n = read_units(src, 0, 1, ["n"]).column("n")
    assert n.type == pa.float64() and n[-1].as_py() == 1.5


def test_empty_jsonl_and_csv_hold_no_rows(tmp_path):
    for name in ("e.jsonl", "e.csv"):
        src = open_source(touch(tmp_path / name), name.split(".")[1])
        assert read_units(src, 0, 1, ["text"]).num_rows == 0
        assert file_columns(src) == []


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl", "csv"])
def test_missing_column_names_file_and_column(tmp_path, fmt):
    writers = {
        "parquet": lambda p: write_parquet(p, TEXT),
        "arrow": lambda p: write_arrow_file(p, TEXT, 3),
        "jsonl": lambda p: write_jsonl(p, TEXT.to_pylist()),
        "csv": lambda p: write_csv(p, ["text", "n"], [list(r.values()) for r in TEXT.to_pylist()]),
    }
    path = writers[fmt](tmp_path / f"in.{fmt}")
    src = open_source(path, fmt)
    with pytest.raises(SortpackError, match=rf"in\.{fmt}: no column 'nope' \(columns: text, n\)"):
        read_units(src, 0, src.num_units, ["nope"])


def test_file_columns(tmp_path):
    src = open_source(write_parquet(tmp_path / "a.parquet", TEXT), "parquet")
    assert file_columns(src) == ["text", "n"]
    src = open_source(write_jsonl(tmp_path / "a.jsonl", [{"b": 1, "a": "x"}]), "jsonl")
    assert file_columns(src) == ["b", "a"]


def test_unreadable_jsonl_names_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "a"}\n{not json\n')
    src = open_source(str(p), "jsonl")
    with pytest.raises(SortpackError, match=r"bad\.jsonl: cannot read as jsonl"):
        read_units(src, 0, 1, ["text"])


# --- JSONL lines of any size ------------------------------------------------------------


@pytest.mark.parametrize("where", ["first", "middle"])
def test_jsonl_reads_a_10mb_line(tmp_path, where):
    texts = ["hi", "x" * 10_000_000, "yo"] if where == "middle" else ["x" * 10_000_000, "hi", "yo"]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    src = open_source(str(path), "jsonl")
    assert file_columns(src) == ["text"]
    table = read_units(src, 0, 1, ["text"])
    assert [len(t) for t in table.column("text").to_pylist()] == [len(t) for t in texts]


# --- read_unit_rows --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_read_unit_rows_reads_a_row_range_of_one_unit(tmp_path, fmt, monkeypatch):

    monkeypatch.setattr(columnar_formats, "PARTIAL_BATCH_ROWS", 7)  # ranges straddle decode batches
    table = pa.table({"n": np.arange(100, dtype=np.int64), "s": [str(i) for i in range(100)]})
    path = (write_parquet(tmp_path / "a.parquet", table, row_group_size=60) if fmt == "parquet"
            else write_arrow_file(tmp_path / "a.arrow", table, 60))
    src = open_source(path, fmt)
    assert src.unit_rows == [60, 40]
    for unit, lo, hi in [(0, 0, 60), (0, 13, 29), (1, 5, 40), (1, 0, 1), (0, 59, 60), (1, 3, 3)]:
        got = read_unit_rows(src, unit, range(lo, hi), ["n"])
        assert got.column_names == ["n"]
        assert got.column("n").to_pylist() == list(range(unit * 60 + lo, unit * 60 + hi))


def test_one_reader_per_format_and_extension():
    assert format_names() == ("parquet", "arrow", "jsonl", "csv", "megatron")
    assert format_of("a/b.PQ") == "parquet" and format_of("x.feather") == "arrow" and format_of("x.txt") is None
    assert format_of("x.txt", "csv") == "csv"
    with pytest.raises(SortpackError, match="unknown input format 'xml'"):
        open_source("x.xml", "xml")


class LinesFormat(text_formats.TextFormat):
    """Plain text: one sample per non-blank line, in column ``text`` (a format the package does not ship)."""

    name = "lines"
    extensions = (".lines",)

    def column_names(self, src):
        return ["text"]

    def parse(self, src, columns, text_columns):
        with open(src.path, encoding="utf-8") as fh:
            table = pa.table({"text": [line.rstrip("\n") for line in fh if line.strip()]})
        return table if columns is None else table.select(columns)


def test_a_new_format_is_one_class_in_the_registry(tmp_path, monkeypatch):
    # discovery, analyze, the fingerprint, the store's schema and the reader all ask the registry
    from sortpack.parallel import SerialComm
    from sortpack.pipeline.dataset import JobInfo, JobOutput, run_all
    from sortpack.reader import SourceDataset
    from sortpack.stages.analyze import AnalyzeOptions
    from sortpack.stages.pack import PackOptions
    from sortpack.stages.plan_options import PlanOptions
    from sortpack.stages.sort import SortOptions
    from sortpack.write.store import StoreOptions

    monkeypatch.setitem(formats.READERS, "lines", LinesFormat())
    texts = ["x" * int(n) for n in np.random.default_rng(1).integers(1, 60, size=200)]
    path = tmp_path / "a.lines"
    path.write_text("\n".join(texts) + "\n")
    assert format_of(str(path)) == "lines" and "lines" in format_names()
    run_all(SerialComm(), [str(path)], PlanOptions(AnalyzeOptions(column="text"), SortOptions(),
                                                   PackOptions(max_tokens=300)),
            JobOutput(str(tmp_path / "plan"), JobInfo(argv=["tests"]), store=StoreOptions(columns=("text",))))
    manifest = json.loads((tmp_path / "plan" / "manifest.json").read_text())
    assert manifest["source"]["files"][0]["format"] == "lines"
    assert manifest["source"]["files"][0]["sha256_of"] == "file"
    data = SourceDataset(tmp_path / "plan", stored=False)
    assert [data[i]["text"] for i in (0, 7, 199)] == [texts[0], texts[7], texts[199]]
    stored = SourceDataset(tmp_path / "plan")
    assert all(stored[i]["text"] == texts[i] for i in range(0, 200, 13))


def test_a_format_names_a_row_its_own_way(tmp_path):
    # a JSONL file names the line, others the row
    bad = b'{"text": "ok"}\n\n{"text": "\xff"}\n'
    (tmp_path / "a.jsonl").write_bytes(bad)
    assert formats.READERS["jsonl"].row_position(open_source(str(tmp_path / "a.jsonl"), "jsonl"), 1) == "line 3"
    assert formats.READERS["parquet"].row_position(None, 1) == "row 1"


@pytest.mark.parametrize("block", [64, 1 << 20])
def test_jsonl_and_csv_of_one_or_many_blocks_read_the_same_rows(tmp_path, monkeypatch, block):
    # one block is parsed in the calling thread, many by pyarrow's pool; a line longer than the
    # block is read again with a larger one
    monkeypatch.setattr(text_formats, "JSON_BLOCK", block)
    texts = ["w" * n for n in (3, 200, 7, 1, 90)] * 4
    (tmp_path / "x.jsonl").write_text("".join(json.dumps({"text": t, "n": len(t)}) + "\n" for t in texts))
    (tmp_path / "x.csv").write_text("text,n\n" + "".join(f"{t},{len(t)}\n" for t in texts))
    for name in ("x.jsonl", "x.csv"):
        src = open_source(str(tmp_path / name), format_of(name))
        got = read_units(src, 0, 1, ["text", "n"])
        assert got.column("text").to_pylist() == texts and got.column("n").to_pylist() == [len(t) for t in texts]
