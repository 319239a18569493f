"""Build a small text dataset from real text every machine has: the Python standard
library's own source, one row per function or class (plus one per module's remainder).

    python examples/make_stdlib_dataset.py example/ [--max-files N] [--shards K]

Writes K parquet shards with columns `text` (the source code), `path` and `name`.
"""
from __future__ import annotations

import argparse
import ast
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def functions_of(path: Path):
    """Yield (name, source) of every function and class defined at any depth in a file."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            text = ast.get_source_segment(source, node)
            if text:
                yield node.name, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-files", type=int, default=400)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts
                   and "test" not in p.parts and "tests" not in p.parts)[: args.max_files]
    rows = [(str(f.relative_to(stdlib)), name, text) for f in files for name, text in functions_of(f)]
    args.out.mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // args.shards)
    for k in range(args.shards):
        part = rows[k * per:(k + 1) * per]
        table = pa.table({"path": [r[0] for r in part], "name": [r[1] for r in part], "text": [r[2] for r in part]})
        pq.write_table(table, args.out / f"part-{k:03d}.parquet", row_group_size=2000)
    print(f"wrote {len(rows)} rows from {len(files)} files of {stdlib} into {args.out}/ ({args.shards} shards)")


if __name__ == "__main__":
    main()
