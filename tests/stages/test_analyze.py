"""Stage 1, analyze: sortpack.stages.analyze on the one-rank communicator and on in-process ranks."""
from __future__ import annotations

import json
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.errors import SortpackError
from sortpack.parallel import Comm, SerialComm
from sortpack.stages import read_plan
from sortpack.stages.analyze import AnalyzeOptions, Keepers, analyze


def write_parquet(path, texts, row_group_size=None, **extra):
    """Write a Parquet file with a ``text`` column (plus ``extra`` columns); return the path."""
    pq.write_table(pa.table({"text": texts, **extra}), str(path), row_group_size=row_group_size)
    return str(path)


def write_arrow(path, texts, batch_rows, stream=False, **extra):
    """Write an Arrow IPC file (or stream) of ``batch_rows``-row batches; return the path."""
    t = pa.table({"text": texts, **extra})
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with opener(str(path), t.schema) as w:
        for b in t.to_batches(max_chunksize=batch_rows):
            w.write_batch(b)
    return str(path)


def write_jsonl(path, texts, **extra):
    """Write JSON lines with a ``text`` key (plus ``extra`` keys); return the path."""
    with open(path, "w", encoding="utf-8") as fh:
        for i, s in enumerate(texts):
            fh.write(json.dumps({"text": s, **{k: v[i] for k, v in extra.items()}}, ensure_ascii=False) + "\n")
    return str(path)


def write_csv(path, texts, **extra):
    """Write a CSV file with a ``text`` column (plus ``extra`` columns); return the path."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(",".join(["text", *extra]) + "\n")
        for i, s in enumerate(texts):
            fh.write(",".join([s, *(str(v[i]) for v in extra.values())]) + "\n")
    return str(path)


def texts(prefix, n):
    """Return ``n`` distinct non-ASCII strings of varied lengths."""
    return [f"{prefix}é{'x' * (i % 7)} {i}" for i in range(n)]


def run(inputs, **opts):
    """Run analyze on one rank."""
    return analyze(SerialComm(), [str(p) for p in inputs], AnalyzeOptions(**opts))


@pytest.fixture
def mixed(tmp_path):
    """Files of every format, with the texts each holds, in the order they are given."""
    parts = [
        ("parquet", texts("p", 11), lambda p, t: write_parquet(p, t, row_group_size=3)),
        ("arrow", texts("a", 9), lambda p, t: write_arrow(p, t, 2)),
        ("arrows", texts("s", 5), lambda p, t: write_arrow(p, t, 2, stream=True)),
        ("jsonl", texts("j", 6), write_jsonl),
        ("csv", texts("c", 4), write_csv),
    ]
    files = []
    for ext, tx, writer in parts:
        path = tmp_path / f"in.{'arrow' if ext == 'arrows' else ext}"
        path = tmp_path / ext / path.name
        path.parent.mkdir()
        files.append((writer(path, tx), tx))
    return files


# --- formats and sample identity ---------------------------------------------------


@pytest.mark.parametrize("which", range(5))
def test_each_format(mixed, which):
    path, tx = mixed[which]
    s = run([path])
    assert s.size.tolist() == [len(t) for t in tx]
    assert s.sample_id.tolist() == list(range(len(tx)))
    assert (s.start, s.total) == (0, len(tx))
    assert s.difficulty is s.size or s.difficulty.tolist() == s.size.tolist()
    assert [f["rows"] for f in s.files] == [len(tx)]


def test_mixed_formats_number_rows_in_command_line_order(mixed):
    order = [3, 0, 4, 2, 1]
    s = run([mixed[i][0] for i in order])
    expect = [len(t) for i in order for t in mixed[i][1]]
    assert s.size.tolist() == expect
    assert s.sample_id.tolist() == list(range(len(expect)))
    assert [f["path"] for f in s.files] == [mixed[i][0] for i in order]
    assert [f["rows"] for f in s.files] == [len(mixed[i][1]) for i in order]
    assert [f["format"] for f in s.files] == ["jsonl", "parquet", "csv", "arrow", "arrow"]


def test_directory_rows_follow_sorted_path_order(tmp_path):
    d = tmp_path / "data"
    (d / "b").mkdir(parents=True)
    write_parquet(d / "b" / "x.parquet", ["bbbb"])
    write_jsonl(d / "a.jsonl", ["a"])
    write_csv(d / "c.csv", ["ccccccccc"])
    write_parquet(d / "_skip.parquet", ["never"])
    write_parquet(d / ".skip.parquet", ["never"])
    s = run([d])
    assert s.size.tolist() == [1, 4, 9]  # a.jsonl, b/x.parquet, c.csv


def test_glob_and_file_together(tmp_path):
    for i in range(3):
        write_parquet(tmp_path / f"part-{i}.parquet", ["x" * (i + 1)] * 2)
    first = write_jsonl(tmp_path / "first.jsonl", ["0123456789"])
    s = run([first, tmp_path / "part-*.parquet"])
    assert s.size.tolist() == [10, 1, 1, 2, 2, 3, 3]


def test_same_file_twice_counts_twice(tmp_path):
    p = write_parquet(tmp_path / "a.parquet", ["ab", "c"])
    assert run([p, p]).size.tolist() == [2, 1, 2, 1]


def test_empty_files_and_row_groups_take_no_ids(tmp_path):
    e1 = write_parquet(tmp_path / "e.parquet", pa.array([], pa.string()))
    e2 = tmp_path / "e.jsonl"
    e2.write_bytes(b"")
    a = write_parquet(tmp_path / "a.parquet", ["abc", "d"])
    s = run([e1, e2, a])
    assert s.size.tolist() == [3, 1] and s.sample_id.tolist() == [0, 1]
    assert [f["rows"] for f in s.files] == [0, 0, 2]


def test_many_reads_per_file(tmp_path, monkeypatch):
    monkeypatch.setattr(read_plan, "READ_ROWS", 4)
    tx = texts("r", 23)
    s = run([write_parquet(tmp_path / "a.parquet", tx, row_group_size=3)])
    assert s.size.tolist() == [len(t) for t in tx]


@pytest.mark.parametrize("with_jsonl", [False, True])
def test_the_reads_land_in_one_sizes_array_where_the_rows_are_known(tmp_path, monkeypatch, with_jsonl):
    # no concatenation of per-read pieces (a second copy as large) when every unit's rows are known
    monkeypatch.setattr(read_plan, "READ_ROWS", 4)
    tx = texts("w", 23)
    paths = [write_parquet(tmp_path / "a.parquet", tx, row_group_size=3)]
    if with_jsonl:  # whole jsonl files' rows are known only once read: the pieces are concatenated
        paths.append(write_jsonl(tmp_path / "b.jsonl", tx[:5]))
    joined = []
    real = np.concatenate

    def spy(parts, *a, **kw):
        joined.append(sum(len(p) for p in parts))
        return real(parts, *a, **kw)

    monkeypatch.setattr(np, "concatenate", spy)
    s = run(paths, difficulty="words")
    monkeypatch.setattr(np, "concatenate", real)
    every = tx + (tx[:5] if with_jsonl else [])
    assert s.size.tolist() == [len(t) for t in every] and s.sample_id.tolist() == list(range(len(every)))
    assert s.difficulty.tolist() == [len(t.split()) for t in every]
    # the difficulty's pieces are joined either way; the sizes' only when a jsonl file's rows were unknown
    assert joined.count(len(every)) == (2 if with_jsonl else 1)


# --- SPECs end to end ---------------------------------------------------------------


def test_size_kinds(tmp_path):
    tx = ["héllo wörld", "a  b c", "数据"]
    p = write_parquet(tmp_path / "a.parquet", tx)
    assert run([p], size="length").size.tolist() == [11, 6, 2]
    assert run([p], size="bytes").size.tolist() == [len(t.encode()) for t in tx]
    assert run([p], size="words").size.tolist() == [2, 3, 1]


def test_column_resolution(tmp_path):
    one = write_parquet(tmp_path / "one.parquet", ["ab"])
    assert run([one]).size.tolist() == [2]  # the only column
    pq.write_table(pa.table({"id": [1], "body": ["abc"]}), str(tmp_path / "two.parquet"))
    assert run([tmp_path / "two.parquet"], column="body").size.tolist() == [3]
    with pytest.raises(SortpackError, match="--size length needs --column"):
        run([tmp_path / "two.parquet"])
    pq.write_table(pa.table({"id": [1], "text": ["abcd"]}), str(tmp_path / "three.parquet"))
    assert run([tmp_path / "three.parquet"]).size.tolist() == [4]  # "text" wins


def test_difficulty_defaults_to_size_and_can_differ(tmp_path):
    p = write_parquet(tmp_path / "a.parquet", ["aaa", "b b", "c"], score=[0.5, 2.25, 1.0], n=[7, 8, 9])
    s = run([p], column="text")
    assert s.difficulty.tolist() == s.size.tolist() == [3, 3, 1]
    s = run([p], column="text", difficulty="column:score")
    assert s.size.tolist() == [3, 3, 1]
    assert s.difficulty.dtype == np.float64 and s.difficulty.tolist() == [0.5, 2.25, 1.0]
    s = run([p], column="text", size="column:n", difficulty="words")
    assert s.size.tolist() == [7, 8, 9] and s.difficulty.tolist() == [1, 2, 1]


def test_scaled_column_size_and_difficulty(tmp_path):
    p = write_parquet(tmp_path / "a.parquet", ["x"] * 3, dur=[0.07, 1.234, 2.0])
    s = run([p], size="column:dur*100", difficulty="column:dur*100")
    assert s.size.dtype == np.int64 and s.size.tolist() == [7, 124, 200]
    assert s.difficulty.dtype == np.float64 and s.difficulty.tolist() == pytest.approx([7.0, 123.4, 200.0])


def test_tokens_end_to_end(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hello world", "hello, fox!"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    p = write_jsonl(tmp_path / "a.jsonl", ["hello, world!", "fox", "x y z w"])
    s = run([p], size="tokens", tokenizer=str(tmp_path / "tokenizer.json"))
    assert s.size.tolist() == [4, 1, 4]


class KeptIds:
    """A TokenKeeper that counts each text's tokens and keeps their ids, as ``run --store-tokens``'s cache does."""

    def __init__(self):
        self.ids = []

    def count_and_keep(self, table, column, tokenizer, where):
        encodings = tokenizer.encode_batch(table.column(column).to_pylist())
        self.ids += [e.ids for e in encodings]
        return np.array([len(e.ids) for e in encodings], dtype=np.int64)


def test_keep_tokens_counts_the_sizes_and_keeps_the_ids_of_that_encode(tmp_path):
    from support import make_special_tokenizer

    tokenizer = make_special_tokenizer(tmp_path / "tokenizer.json")
    tx = ["hello, world!", "fox", "x y z w", "the quick brown fox"]
    p = write_parquet(tmp_path / "a.parquet", tx, row_group_size=3)
    plain = run([p], size="tokens", tokenizer=tokenizer)
    keeper = KeptIds()
    kept = analyze(SerialComm(), [p], AnalyzeOptions(size="tokens", tokenizer=tokenizer), keep=Keepers(keeper))
    assert kept.size.tolist() == plain.size.tolist() == [len(i) for i in keeper.ids]
    assert len(keeper.ids) == len(tx)
    # a SPEC that counts no tokens never asks the keeper
    unused = KeptIds()
    analyze(SerialComm(), [p], AnalyzeOptions(size="length", difficulty="tokens", tokenizer=tokenizer),
            keep=Keepers(unused))
    assert unused.ids == []


def test_python_function_end_to_end(tmp_path, monkeypatch):
    (tmp_path / "sp_analyze_funcs.py").write_text(
        "import pyarrow.compute as pc\n"
        "def twice(batch):\n"
        "    return pc.multiply(pc.utf8_length(batch.column('text')), 2)\n"
        "def ratio(batch):\n"
        "    return pc.divide(pc.cast(batch.column('n'), 'float64'), 4)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    empty = write_parquet(tmp_path / "e.parquet", pa.array([], pa.string()), n=pa.array([], pa.int64()))
    p = write_parquet(tmp_path / "a.parquet", ["ab", "cde"], row_group_size=1, n=[1, 6])
    s = run([empty, p], size="python:sp_analyze_funcs:twice", difficulty="python:sp_analyze_funcs:ratio")
    assert s.size.tolist() == [4, 6] and s.difficulty.tolist() == [0.25, 1.5]


# --- errors -------------------------------------------------------------------------


def test_error_missing_column(tmp_path):
    p = write_parquet(tmp_path / "in.parquet", ["a"])
    with pytest.raises(SortpackError, match=r"in\.parquet: no column 'body' \(columns: text\)"):
        run([p], column="body")


def test_error_missing_column_in_later_file(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", ["a"])
    pq.write_table(pa.table({"other": ["b"]}), str(tmp_path / "b.parquet"))
    with pytest.raises(SortpackError, match=r"b\.parquet: no column 'text'"):
        run([a, tmp_path / "b.parquet"], column="text")


def test_error_wrong_type(tmp_path):
    p = write_parquet(tmp_path / "in.parquet", ["a"], n=[1])
    with pytest.raises(SortpackError, match=r"in\.parquet: column 'n' is int64; length needs"):
        run([p], column="n")
    with pytest.raises(SortpackError, match=r"in\.parquet: column 'text' is string, not numeric"):
        run([p], size="column:text")


def test_error_nulls(tmp_path):
    p = write_jsonl(tmp_path / "in.jsonl", ["a", None])
    with pytest.raises(SortpackError, match=r"in\.jsonl: column 'text' has 1 null values"):
        run([p])


def test_error_negative_and_nan(tmp_path):
    p = write_parquet(tmp_path / "in.parquet", ["a", "b"], n=[1, -2], d=[0.5, float("nan")])
    with pytest.raises(SortpackError, match=r"in\.parquet: --size column:n has 1 negative values"):
        run([p], size="column:n")
    with pytest.raises(SortpackError, match=r"in\.parquet: --difficulty column:n has 1 negative values"):
        run([p], column="text", difficulty="column:n")
    with pytest.raises(SortpackError, match=r"in\.parquet: column:d has 1 NaN or infinite values"):
        run([p], size="column:d")


def test_error_empty_input(tmp_path):
    p = write_parquet(tmp_path / "in.parquet", pa.array([], pa.string()))
    with pytest.raises(SortpackError, match=r"in\.parquet: the input holds no rows"):
        run([p])


@pytest.mark.parametrize("make, message", [
    (lambda t: [t / "missing.parquet"], r"missing\.parquet: no such file or directory"),
    (lambda t: [t / "in.txt"], r"in\.txt: cannot tell the format from the extension"),
])
def test_error_bad_paths(tmp_path, make, message):
    (tmp_path / "in.txt").write_text("text\nabc\n")
    with pytest.raises(SortpackError, match=message):
        run(make(tmp_path))


def test_error_not_the_forced_format(tmp_path):
    p = write_jsonl(tmp_path / "in.jsonl", ["a"])
    with pytest.raises(SortpackError, match=r"in\.jsonl: cannot read as parquet"):
        run([p], input_format="parquet")


def test_error_unknown_input_format(tmp_path):
    p = write_jsonl(tmp_path / "in.jsonl", ["a"])
    with pytest.raises(SortpackError, match="--input-format: unknown format 'xml'"):
        run([p], input_format="xml")


def test_forced_format_reads_odd_extension(tmp_path):
    p = tmp_path / "data.txt"
    p.write_text('{"text": "abc"}\n')
    assert run([p], input_format="jsonl").size.tolist() == [3]


@pytest.mark.parametrize("opts, message", [
    ({"size": "sizes"}, r"--size 'sizes': expected length"),
    ({"difficulty": "column:"}, r"--difficulty 'column:': expected"),
    ({"size": "tokens"}, "--size tokens needs --tokenizer"),
    ({"difficulty": "tokens"}, "--difficulty tokens needs --tokenizer"),
    ({"size": "python:sp_none_such:f"}, r"python:sp_none_such:f: cannot load"),
])
def test_error_bad_spec(tmp_path, opts, message):
    p = write_parquet(tmp_path / "in.parquet", ["a"])
    with pytest.raises(SortpackError, match=message):
        run([p], **opts)


# --- several ranks in one process ---------------------------------------------------


class ThreadComm(Comm):
    """Rank ``rank`` of ``size`` threads: the object collectives analyze uses, via a barrier."""

    def __init__(self, rank, size, shared):
        self.rank, self.size, self._shared = rank, size, shared

    def _exchange(self, obj):
        slots, barrier = self._shared
        slots[self.rank] = obj
        barrier.wait()
        out = list(slots)
        barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return out

    def allgather_obj(self, obj):
        return self._exchange(obj)

    def bcast_obj(self, obj, root=0):
        return self._exchange(obj)[root]

    def allreduce(self, value, op="sum"):
        parts = self._exchange(value)
        return {"sum": sum, "max": max, "min": min}[op](parts)


def run_ranks(ranks, inputs, **opts):
    """Run analyze on ``ranks`` thread ranks; return each rank's SampleColumns or exception."""
    shared = ([None] * ranks, threading.Barrier(ranks, timeout=30))
    results = [None] * ranks

    def work(r):
        try:
            results[r] = analyze(ThreadComm(r, ranks, shared), [str(p) for p in inputs], AnalyzeOptions(**opts))
        except Exception as exc:  # noqa: BLE001 - handed to the test
            results[r] = exc

    threads = [threading.Thread(target=work, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.parametrize("ranks", [2, 3, 5, 8])
def test_ranks_hold_contiguous_slices_of_the_serial_result(mixed, ranks):
    inputs = [p for p, _ in mixed]
    serial = run(inputs)
    parts = run_ranks(ranks, inputs)
    assert all(not isinstance(p, Exception) for p in parts), parts
    assert [p.start for p in parts] == list(np.cumsum([0] + [len(p) for p in parts[:-1]]))
    assert all(p.total == serial.total for p in parts)
    assert np.concatenate([p.sample_id for p in parts]).tolist() == list(range(serial.total))
    assert np.concatenate([p.size for p in parts]).tolist() == serial.size.tolist()
    assert all(p.files == serial.files for p in parts)


def test_ranks_agree_on_difficulty_dtype(tmp_path):
    # rank 0 reads only integers, rank 1 floats: both must return float64
    a = write_parquet(tmp_path / "a.parquet", ["x"], d=pa.array([1], pa.int64()))
    b = write_parquet(tmp_path / "b.parquet", ["y"], d=pa.array([2.5], pa.float64()))
    parts = run_ranks(2, [a, b], column="text", difficulty="column:d")
    assert [len(p) for p in parts] == [1, 1]
    assert [p.difficulty.dtype for p in parts] == [np.float64, np.float64]
    assert [p.difficulty.tolist() for p in parts] == [[1.0], [2.5]]


def test_error_on_one_rank_reaches_every_rank(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", ["x"], n=[1])
    b = write_parquet(tmp_path / "b.parquet", ["y"], n=[-1])
    parts = run_ranks(2, [a, b], size="column:n")
    assert all(isinstance(p, SortpackError) and p.collective for p in parts), parts
    assert all("b.parquet: --size column:n has 1 negative values" in str(p) for p in parts)


def test_more_ranks_than_units(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", ["ab", "c"])
    parts = run_ranks(3, [p])
    assert sorted(len(x) for x in parts) == [0, 0, 2]
    assert [x.total for x in parts] == [2, 2, 2]


def test_parquet_and_arrow_files_describe_their_units_bytes(tmp_path):
    from sortpack.inputs.formats import open_source

    table = pa.table({"text": [f"{i:03d}" * 34 for i in range(30)]})  # distinct values: no dictionary
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=10)
    src = open_source(str(tmp_path / "a.parquet"), "parquet")
    assert src.unit_rows == [10, 10, 10] and len(src.unit_bytes) == 3 and min(src.unit_bytes) >= 1000
    with pa.OSFile(str(tmp_path / "a.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=15):
            w.write_batch(batch)
    src = open_source(str(tmp_path / "a.arrow"), "arrow")
    assert src.unit_rows == [15, 15] and min(src.unit_bytes) >= 1500
