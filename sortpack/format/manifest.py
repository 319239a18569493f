"""Manifests: the JSON file that describes a sortpack directory, written last."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..errors import SortpackError
from .integrity import check_member_name
from .kinds import FORMATS, KIND_OF_FORMAT, SHARD_PREFIX

VERSION = 1
DATA_VERSION = 2  # an index with stored data shards (``data`` in the manifest)
VERSIONS = (VERSION, DATA_VERSION)
MANIFEST = "manifest.json"


def canonical_json(obj) -> bytes:
    """Return the canonical JSON bytes used for hashing (sorted keys, no spaces)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def content_hash(manifest: dict) -> str:
    """Return the sha256 of a manifest without its ``content_hash`` and ``provenance``."""
    body = {k: v for k, v in manifest.items()
            if k not in ("content_hash", "provenance") and not k.startswith("_")}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def shard_name(kind: str, index: int) -> str:
    """Return the file name of shard ``index`` of a directory of ``kind``."""
    return f"{SHARD_PREFIX[kind]}-{index:05d}.arrow"


def read_manifest(directory: str | os.PathLike, expect: str | tuple[str, ...] | None = None) -> dict:
    """Return the parsed manifest of ``directory``, refusing unknown formats and versions.

    ``expect`` names the accepted kinds ("metrics", "sorted", "index").
    """
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise SortpackError(f"{directory}: no such directory")
    if not path.is_file():
        raise SortpackError(f"{directory}: not a sortpack directory (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SortpackError(f"{path}: unreadable manifest ({exc})") from None
    fmt = manifest.get("format")
    kind = KIND_OF_FORMAT.get(fmt)
    if kind is None:
        raise SortpackError(f"{path}: unknown format {fmt!r}")
    if manifest.get("version") not in VERSIONS:
        raise SortpackError(
            f"{path}: {fmt} version {manifest.get('version')!r} is not supported "
            f"(this sortpack reads versions {', '.join(map(str, VERSIONS))})"
        )
    if expect is not None:
        kinds = (expect,) if isinstance(expect, str) else expect
        if kind not in kinds:
            want = " or ".join(FORMATS[k] for k in kinds)
            raise SortpackError(f"{directory}: is a {fmt} directory, expected {want}")
    _check_keys(path, manifest, kind)
    manifest["_kind"] = kind
    return manifest


_REQUIRED = ("num_rows", "num_samples", "rows_per_shard", "shards", "options", "stats", "source", "content_hash")
_SHARD_KEYS = ("file", "first", "rows", "bytes", "sha256")


def _check_keys(path: Path, manifest: dict, kind: str) -> None:
    """Raise one clear line for a manifest that lacks what readers look up (hand-edited, truncated)."""
    for key in _REQUIRED + (("num_microbatches",) if kind == "index" else ()):
        if key not in manifest:
            raise SortpackError(f"{path}: missing key {key!r}")
    if not isinstance(manifest["shards"], list):
        raise SortpackError(f"{path}: 'shards' is not a list")
    for i, entry in enumerate(manifest["shards"]):
        missing = [k for k in _SHARD_KEYS if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise SortpackError(f"{path}: missing key {missing[0]!r} in shards[{i}]")
    for i, entry in enumerate(manifest["shards"]):
        check_member_name(path.parent, entry["file"], f"shards[{i}]")
    data = manifest.get("data")
    if data is not None:
        shards = data.get("shards") if isinstance(data, dict) else None
        if not isinstance(shards, list) or "columns" not in data or "num_rows" not in data:
            raise SortpackError(f"{path}: 'data' lacks its shards, columns or num_rows")
        for i, entry in enumerate(shards):
            missing = [k for k in _SHARD_KEYS if not isinstance(entry, dict) or k not in entry]
            if missing:
                raise SortpackError(f"{path}: missing key {missing[0]!r} in data.shards[{i}]")
            check_member_name(path.parent, entry["file"], f"data.shards[{i}]")
    if not isinstance(manifest["source"], dict) or "files" not in manifest["source"]:
        raise SortpackError(f"{path}: missing key 'files' in 'source'")


def write_manifest(directory: str | os.PathLike, manifest: dict) -> dict:
    """Write ``manifest`` (adding ``content_hash``) into ``directory`` and return it."""
    manifest = {k: v for k, v in manifest.items() if not k.startswith("_")}
    manifest["content_hash"] = content_hash(manifest)
    text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False)
    (Path(directory) / MANIFEST).write_text(text + "\n")
    return manifest
