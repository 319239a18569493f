"""Where and when each input file of a plan was read, kept beside ``source.files`` in the provenance.

The location (path or URL) and version (mtime, ETag) of an input say nothing of what it
holds, so they stay out of ``content_hash`` (``inputs.fingerprints`` says why). No MPI and
no I/O here: the reader side restores a manifest's paths with ``with_locations`` too.
"""
from __future__ import annotations

_WHERE = (("path", "source_paths"), ("mtime_ns", "source_mtime_ns"), ("etag", "source_etags"))


def split_locations(files: list[dict]) -> tuple[list[dict], dict]:
    """Return the entries without ``path``, ``mtime_ns`` and ``etag``, and the provenance lists that hold them.

    A list is left out when no entry has its key (``source_etags`` of local files).
    """
    prov = {name: [f.get(key) for f in files] for key, name in _WHERE if any(key in f for f in files)}
    keys = {key for key, _ in _WHERE}
    return [{k: v for k, v in f.items() if k not in keys} for f in files], prov


def with_locations(manifest: dict) -> list[dict]:
    """Return a manifest's ``source.files`` with each file's ``path``, ``mtime_ns`` and ``etag`` from the provenance."""
    files = [dict(f) for f in manifest["source"]["files"]]
    prov = manifest.get("provenance") or {}
    for key, name in _WHERE:
        values = prov.get(name)
        if not isinstance(values, list) or len(values) != len(files):
            continue
        for f, v in zip(files, values):
            if v is not None:
                f[key] = v
    return files
