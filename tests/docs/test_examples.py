"""The README's examples: make_stdlib_dataset builds its dataset quickly and as documented."""
from __future__ import annotations

import ast
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import ROOT


@pytest.mark.slow
def test_make_stdlib_dataset_rows(tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import make_stdlib_dataset as msd
    finally:
        sys.path.remove(str(ROOT / "examples"))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "make_stdlib_dataset.py"), str(tmp_path / "ex"),
                           "--max-files", "15", "--shards", "3"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert time.perf_counter() - t0 < 60
    table = pa.concat_tables(pq.read_table(tmp_path / "ex" / f"part-{k:03d}.parquet") for k in range(3))
    assert table.column_names == ["path", "name", "text"]
    stdlib, files = msd.stdlib_files(15)
    rows = table.to_pylist()
    assert f"wrote {len(rows)} rows from 15 files" in proc.stdout
    for f in files:
        source = f.read_text(encoding="utf-8")
        tree = ast.parse(source)
        mine = [r for r in rows if r["path"] == str(f.relative_to(stdlib))]
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        # every function and class in walk order; the text as ast.get_source_segment gives it (the
        # slow, quadratic oracle: checked on every 7th definition)
        got = [(r["name"], r["text"]) for r in mine if r["name"] != "<module>"]
        assert [name for name, _ in got] == [n.name for n in defs]
        for (_, text), n in list(zip(got, defs))[::7]:
            assert text == ast.get_source_segment(source, n)
        # the module's remainder: the file without its top-level functions and classes
        rest = [r["text"] for r in mine if r["name"] == "<module>"]
        assert len(rest) <= 1
        if rest:
            body = ast.parse(rest[0]).body
            assert body and not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                                    for n in body)
            top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                ast.ClassDef))]
            assert len(body) == len(top)
    assert any(r["name"] == "<module>" for r in rows)


@pytest.mark.slow
def test_compare_modes_counts_truncated_samples_and_cleans_up(tmp_path):
    import os

    import numpy as np

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "compare_modes.py"), "--lognormal", "2000",
                           "--max-tokens", "2048", "--modes", "padded,quadratic,rows"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr
    assert list(scratch.iterdir()) == []  # the temporary directory is gone
    # the same draw as the script: samples over each mode's limit are truncated
    n = np.clip(np.ceil(np.random.default_rng(0).lognormal(np.log(300), 1.0, 2000)), 1, 8192)
    expected = {"padded": int((n > 2048).sum()), "quadratic": int((n + n * n / 128 > 2048).sum()),
                "rows": int((n > 1024).sum())}
    header, *lines = proc.stdout.splitlines()
    col = header.split().index("truncated") - 1  # the row without its mode name
    got = {}
    for line in lines:
        name, rest = line[:20].strip(), line[20:].split()
        got[name.split()[0]] = int(rest[col])
    assert got == expected and all(expected.values())
