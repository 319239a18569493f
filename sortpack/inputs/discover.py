"""Input discovery: command-line paths, directories, globs and Hugging Face save_to_disk layouts
expanded to the input files, in sample-id order."""
from __future__ import annotations

import glob
import json
import os
import stat
from typing import NamedTuple

from ..errors import SortpackError, one_line
from . import objects
from .formats import format_names, format_of


class InputPath(NamedTuple):
    """One input file found on the command line: its absolute path and input format."""

    path: str
    format: str


def expand_inputs(inputs: list[str], input_format: str = "auto", split: str | None = None) -> list[InputPath]:
    """Return the path and format of every input file, in sample-id order.

    Files keep command-line order; directories expand recursively in sorted path order
    (files of unknown extension skipped); globs expand in sorted order. A Hugging Face
    ``save_to_disk`` directory is its ``data-*.arrow`` files in ``state.json`` order (its JSON
    metadata is no data); a ``DatasetDict`` directory is the dataset of split ``split``.

    ``s3://`` and ``gs://`` URLs name an object, a prefix (every object below it, in key
    order, the same rules as a directory) or a glob (``*``, ``?`` within a name, ``**``
    across names); they are kept as given (``inputs.objects``).
    """
    if input_format not in ("auto", *format_names()):
        raise SortpackError(f"--input-format: unknown format {input_format!r}")
    if not inputs:
        raise SortpackError("no input files given")
    out: list[tuple[str, str]] = []
    used_split = False
    for item in inputs:
        objects.check_scheme(item)
        if objects.is_url(item):
            out.extend(_expand_url(item, input_format))
        elif os.path.isdir(item):
            files, has_dict = _expand_directory(item, input_format, split)
            out.extend(files)
            used_split |= has_dict
        elif os.path.lexists(item) and not os.path.isdir(item):
            check_input_path(item)
            fmt = format_of(item, input_format)
            if fmt is None:
                raise SortpackError(
                    f"{item}: cannot tell the format from the extension (use --input-format)")
            out.append((item, fmt))
        elif glob.has_magic(item):
            out.extend(_expand_glob(item, input_format))
        else:
            raise SortpackError(f"{item}: no such file or directory")
    if split is not None and not used_split:
        raise SortpackError(f"--split {split}: no input is a Hugging Face DatasetDict directory "
                            f"(one with {HF_DICT})")
    return [InputPath(p if objects.is_url(p) else os.path.abspath(p), f) for p, f in out]


def _expand_directory(item: str, input_format: str, split: str | None) -> tuple[list[tuple[str, str]], bool]:
    """Return (the input files below a directory in order, whether a DatasetDict was among them)."""
    groups = []  # (sort key, files in order): a Hugging Face dataset keeps its own order
    used_split = False
    for root, dirs, files in os.walk(item):
        hf = hf_dataset_files(root, split)
        if hf is not None:
            used_split |= os.path.isfile(os.path.join(root, HF_DICT))
            groups.append((root + os.sep, [(p, "arrow") for p in hf]))
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in files:
            if name.startswith((".", "_")):
                continue
            p = os.path.join(root, name)
            fmt = format_of(p, input_format)
            if fmt is not None:
                check_input_path(p)
                groups.append((p, [(p, fmt)]))
    if not groups:
        raise SortpackError(f"{item}: directory holds no parquet, arrow, jsonl or csv files")
    return [f for _, group in sorted(groups, key=lambda g: g[0]) for f in group], used_split


def _expand_glob(item: str, input_format: str) -> list[tuple[str, str]]:
    """Return the files a glob matches, in sorted order, each with its format."""
    matches = sorted(p for p in glob.glob(item, recursive=True) if not os.path.isdir(p))
    if not matches:
        raise SortpackError(f"{item}: no file matches this pattern")
    out = []
    for p in matches:
        check_input_path(p)
        fmt = format_of(p, input_format)
        if fmt is None:
            raise SortpackError(f"{p}: cannot tell the format from the extension (use --input-format)")
        out.append((p, fmt))
    return out


def _hidden(key: str) -> bool:
    """Return whether a key below a listed prefix has a name part starting with ``.`` or ``_`` (skipped)."""
    return any(part.startswith((".", "_")) for part in key.split("/") if part)


def _expand_url(url: str, input_format: str) -> list[tuple[str, str]]:
    """Return the (URL, format) of the objects an s3:// or gs:// item names: one object, a prefix or a glob."""
    if glob.has_magic(url):
        matches = objects.glob_objects(url)
        if not matches:
            raise SortpackError(f"{url}: no object matches this pattern")
        found: list[tuple[str, str]] = []
        for u, _ in matches:
            fmt = format_of(u, input_format)
            if fmt is None:
                raise SortpackError(f"{u}: cannot tell the format from the extension (use --input-format)")
            found.append((u, fmt))
        return found
    what, found_url = objects.lookup(url)
    if what == "file":
        fmt = format_of(url, input_format)
        if fmt is None:
            raise SortpackError(f"{url}: cannot tell the format from the extension (use --input-format)")
        return [(found_url, fmt)]
    if what == "missing":
        raise SortpackError(f"{url}: no such object or prefix")
    base = url.rstrip("/")
    found = []
    for u, _ in objects.list_objects(base):
        if _hidden(u[len(base):]):
            continue
        fmt = format_of(u, input_format)
        if fmt is not None:
            found.append((u, fmt))
    if not found:
        raise SortpackError(f"{url}: prefix holds no parquet, arrow, jsonl or csv objects")
    return found


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"))


def check_input_path(path: str) -> None:
    """Raise SortpackError unless ``path`` names a regular file (after symlinks) by a UTF-8 name.

    A FIFO or a device would block or never end when opened; a name that is not UTF-8
    cannot be recorded in the manifest (JSON) nor handed to Arrow.
    """
    raw = os.fsencode(path)
    shown = raw.decode("utf-8", "backslashreplace")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SortpackError(f"{shown}: the file name is not valid UTF-8; rename the file") from None
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise SortpackError(f"{shown}: cannot open ({exc.strerror or one_line(exc)})") from None
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
        raise SortpackError(f"{shown}: {what}, not a regular file; sortpack reads only regular files")


HF_STATE = "state.json"  # datasets.Dataset.save_to_disk: lists the data files in order
HF_DICT = "dataset_dict.json"  # datasets.DatasetDict.save_to_disk: lists the splits


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise SortpackError(f"{path}: unreadable ({one_line(exc)})") from None
    if not isinstance(data, dict):
        raise SortpackError(f"{path}: expected a JSON object")
    return data


def hf_dataset_files(directory: str, split: str | None = None) -> list[str] | None:
    """Return the data files of a Hugging Face ``save_to_disk`` directory in row order.

    None when ``directory`` is not one. A ``DatasetDict`` directory gives the files of
    ``split``, and without one (or with an unknown one) raises an error listing the splits.
    """
    dict_json = os.path.join(directory, HF_DICT)
    if os.path.isfile(dict_json):
        splits = _read_json(dict_json).get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise SortpackError(f"{dict_json}: no 'splits' list")
        names = ", ".join(splits)
        if split is None:
            raise SortpackError(f"{directory}: a Hugging Face DatasetDict of splits {names}; "
                                f"choose one with --split")
        if split not in splits:
            raise SortpackError(f"--split {split}: {directory} has splits {names}")
        files = hf_dataset_files(os.path.join(directory, split))
        if files is None:
            raise SortpackError(f"{os.path.join(directory, split)}: split {split!r} has no {HF_STATE}")
        return files
    state_json = os.path.join(directory, HF_STATE)
    if not os.path.isfile(state_json):
        return None
    entries = _read_json(state_json).get("_data_files")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "filename" in e for e in entries):
        raise SortpackError(f"{state_json}: no '_data_files' list of file names")
    files = [os.path.join(directory, e["filename"]) for e in entries]
    for p in files:
        if not os.path.isfile(p):
            raise SortpackError(f"{p}: data file listed in {state_json} is missing")
    return files
