"""A mixture source's ``column`` read under the plan's column name: which input column each file gives it from.

A mixture whose sources call their text differently (``"column": "content"``) has one name for it
in the plan: the plan's column (``--column``, else the column the other sources read, else the
first source's). Stored columns, ``SourceDataset`` rows and stored token ids use that name; these
helpers say, per input file, which input column to read for it. Pure: no MPI, no reader.
"""
from __future__ import annotations


def source_renames(plan_column: str | None, source_columns: list[str | None],
                   file_counts: list[int]) -> list[dict[str, str] | None]:
    """Return, per input file in order, ``{plan column: input column}`` (None where the names agree)."""
    out: list[dict[str, str] | None] = []
    for column, count in zip(source_columns, file_counts):
        rename = {plan_column: column} if plan_column and column and column != plan_column else None
        out.extend([rename] * int(count))
    return out


def manifest_renames(manifest: dict) -> list[dict[str, str] | None] | None:
    """Return an index manifest's per-file renames (None when no mixture source reads another column)."""
    mix = manifest.get("mixture")
    plan_column = (manifest.get("options") or {}).get("column")
    if not mix or not plan_column:
        return None
    sources = mix.get("sources", [])
    if not any(s.get("column") and s["column"] != plan_column for s in sources):
        return None
    return source_renames(plan_column, [s.get("column") for s in sources], [s["files"][1] for s in sources])


def read_names(columns: list[str] | None, rename: dict[str, str] | None) -> list[str] | None:
    """Return the input columns to read for plan ``columns`` from a file with ``rename`` (None: all)."""
    if rename is None or columns is None:
        return columns
    return [rename.get(c, c) for c in columns]


def as_plan_names(names: list[str], rename: dict[str, str] | None) -> tuple[list[int], list[str]]:
    """Return (which of a read table's columns to keep, their plan names) for a file with ``rename``.

    The source's own column takes the plan's name; a column of that file already called so is not
    kept (the source named another column as its text).
    """
    if rename is None:
        return list(range(len(names))), list(names)
    back = {v: k for k, v in rename.items()}
    keep = [i for i, n in enumerate(names) if n in back or n not in rename]
    return keep, [back.get(names[i], names[i]) for i in keep]
