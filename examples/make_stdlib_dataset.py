"""Build a small text dataset from real text every machine has: the Python standard
library's own source, one row per function or class (plus one per module's remainder).

    python examples/make_stdlib_dataset.py example/ [--max-files N] [--shards K]

Writes K parquet shards with columns `text` (the source code), `path` and `name`. A
function or class defined inside another is a row of its own and also part of its
parent's text; a module's remainder (imports, constants, top-level statements: the file
without its top-level functions and classes) is one row named `<module>`.
"""
from __future__ import annotations

import argparse
import ast
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def functions_of(path: Path):
    """Yield (name, source) of every function and class defined at any depth in a file, then
    ("<module>", the rest of the file) when the rest holds more than whitespace."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return
    # ast's offsets are (line, UTF-8 byte column): line starts are computed once per file,
    # where ast.get_source_segment splits the whole file again for every node (quadratic)
    data = source.encode("utf-8")
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def span(node) -> tuple[int, int]:
        return starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset

    for node in ast.walk(tree):
        if isinstance(node, _DEFS):
            a, b = span(node)
            yield node.name, data[a:b].decode("utf-8")
    rest, pos = [], 0
    for node in tree.body:
        if isinstance(node, _DEFS):
            a, b = span(node)
            if node.decorator_list:  # the decorators go with what they decorate
                first = min(d.lineno for d in node.decorator_list)
                a = starts[first - 1] + min(d.col_offset for d in node.decorator_list if d.lineno == first) - 1
            rest.append(data[pos:a])
            pos = b
    rest.append(data[pos:])
    remainder = b"".join(rest).decode("utf-8")
    if remainder.strip():
        yield "<module>", remainder


def stdlib_files(max_files: int) -> tuple[Path, list[Path]]:
    """Return the stdlib directory and its first ``max_files`` non-test .py files in path order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts
                   and "test" not in p.parts and "tests" not in p.parts)[:max_files]
    return stdlib, files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-files", type=int, default=400)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args(argv)
    stdlib, files = stdlib_files(args.max_files)
    rows = [(str(f.relative_to(stdlib)), name, text) for f in files for name, text in functions_of(f)]
    args.out.mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // args.shards)
    for k in range(args.shards):
        part = rows[k * per:(k + 1) * per]
        table = pa.table({"path": pa.array([r[0] for r in part], pa.string()),
                          "name": pa.array([r[1] for r in part], pa.string()),
                          "text": pa.array([r[2] for r in part], pa.string())})
        pq.write_table(table, args.out / f"part-{k:03d}.parquet", row_group_size=2000)
    print(f"wrote {len(rows)} rows from {len(files)} files of {stdlib} into {args.out}/ ({args.shards} shards)")


if __name__ == "__main__":
    main()
