"""Input discovery: sortpack.inputs.discover."""
from __future__ import annotations

import pytest

from sortpack.errors import SortpackError
from sortpack.inputs.discover import expand_inputs


def touch(path):
    """Create an empty file (and its directory) and return the path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return str(path)


# --- expand_inputs ------------------------------------------------------------------


def test_files_keep_command_line_order(tmp_path):
    b = touch(tmp_path / "b.parquet")
    a = touch(tmp_path / "a.jsonl")
    assert expand_inputs([b, a]) == [(b, "parquet"), (a, "jsonl")]


def test_every_extension_maps_to_its_format(tmp_path):
    names = {"x.parquet": "parquet", "x.pq": "parquet", "x.arrow": "arrow", "x.feather": "arrow",
             "x.ipc": "arrow", "x.jsonl": "jsonl", "x.ndjson": "jsonl", "x.json": "jsonl", "x.csv": "csv",
             "X.PARQUET": "parquet"}
    for name, fmt in names.items():
        p = touch(tmp_path / name)
        assert expand_inputs([p]) == [(p, fmt)]


def test_directory_is_recursive_sorted_and_skips_hidden_and_underscore(tmp_path):
    d = tmp_path / "data"
    keep = [touch(d / p) for p in ("a.parquet", "b/c.jsonl", "b/d.csv", "c.arrow", "z/y/x.parquet")]
    for p in (".hidden.parquet", "_SUCCESS", "_metadata.parquet", ".git/x.parquet", "_tmp/y.parquet",
              "b/.part.csv", "README.md", "notes.txt"):
        touch(d / p)
    got = expand_inputs([str(d)])
    assert [p for p, _ in got] == sorted(keep)
    assert [f for _, f in got] == ["parquet", "jsonl", "csv", "arrow", "parquet"]


def test_directories_and_files_interleave_in_command_line_order(tmp_path):
    d = tmp_path / "d"
    inner = [touch(d / "2.parquet"), touch(d / "1.parquet")]
    first = touch(tmp_path / "z.csv")
    last = touch(tmp_path / "a.jsonl")
    got = [p for p, _ in expand_inputs([first, str(d), last])]
    assert got == [first, sorted(inner)[0], sorted(inner)[1], last]


def test_glob_expands_sorted(tmp_path):
    paths = [touch(tmp_path / f"part-{i}.parquet") for i in (3, 1, 2)]
    touch(tmp_path / "other.csv")
    got = expand_inputs([str(tmp_path / "part-*.parquet")])
    assert [p for p, _ in got] == sorted(paths)


def test_recursive_glob(tmp_path):
    paths = [touch(tmp_path / "x" / "a.jsonl"), touch(tmp_path / "y" / "z" / "b.jsonl")]
    got = expand_inputs([str(tmp_path / "**" / "*.jsonl")])
    assert [p for p, _ in got] == sorted(paths)


def test_paths_become_absolute(tmp_path, monkeypatch):
    touch(tmp_path / "a.csv")
    monkeypatch.chdir(tmp_path)
    assert expand_inputs(["a.csv"]) == [(str(tmp_path / "a.csv"), "csv")]


def test_forced_format_overrides_extension(tmp_path):
    p = touch(tmp_path / "shard.bin")
    assert expand_inputs([p], "arrow") == [(p, "arrow")]


@pytest.mark.parametrize("make, expect", [
    (lambda t: [str(t / "nope.parquet")], "nope.parquet: no such file or directory"),
    (lambda t: [touch(t / "data.txt")], "data.txt: cannot tell the format"),
    (lambda t: [str(t / "*.parquet")], "*.parquet: no file matches"),
    (lambda t: [touch(t / "x.txt") and str(t / "*.txt")], "x.txt: cannot tell the format"),
    (lambda t: [(t / "empty").mkdir() or str(t / "empty")], "empty: directory holds no"),
    (lambda t: [], "no input files"),
])
def test_expand_errors_name_the_input(tmp_path, make, expect):
    with pytest.raises(SortpackError, match=None) as info:
        expand_inputs(make(tmp_path))
    assert expect in str(info.value)


def test_unknown_input_format(tmp_path):
    with pytest.raises(SortpackError, match="--input-format: unknown format 'xml'"):
        expand_inputs([touch(tmp_path / "a.csv")], "xml")
