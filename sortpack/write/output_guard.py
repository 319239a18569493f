"""Pre-flight checks of an output path, and the temporaries that killed jobs left beside it.

Before any work, rank 0 checks that the output can be written and that ``--overwrite``
would replace only what sortpack wrote (docs/guarantees.md). A job's temporary sibling
directories carry their owner in their name (``.NAME.tmp-TOKEN-PID-START@HOST``), so a later
job into the same output can tell the temporaries of dead jobs from those of live ones and
remove only the former.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from ..errors import SortpackError, one_line
from ..format.kinds import KIND_OF_FORMAT, KINDS
from ..format.manifest import MANIFEST

# the files sortpack writes into an output directory: manifest, shards, data shards
_PREFIXES = "|".join(sorted({re.escape(k.shard_prefix) for k in KINDS.values()} | {"data"}))
_OWN_FILES = re.compile(r"^(?:" + _PREFIXES + r")-\d{5,}\.arrow$")


def _show(path: str | os.PathLike) -> str:
    """Return a path for a message: bytes that are not UTF-8 shown escaped, never a crash."""
    return os.fsdecode(path).encode("utf-8", "backslashreplace").decode("utf-8")


HOLDOUT_DIR = "holdout"  # the held-out plan an index holds (``run --holdout``); stages.holdout.DIRECTORY


def is_sortpack_output(path: Path, nested: bool = True) -> str | None:
    """Return why ``path`` may not be replaced, or None when it is empty or a sortpack output.

    A sortpack output is a directory whose manifest names a format sortpack writes and that
    holds nothing but the manifest and shard files, and, where its manifest records a
    held-out plan, the ``holdout/`` directory holding that plan alone (itself a sortpack
    output with no directory inside; ``nested=False`` checks one such). A user's file put
    inside either (or any other subdirectory) makes it not replaceable, as its deletion
    would lose what sortpack did not write.
    """
    if path.is_symlink():
        return "is a symbolic link"
    if not path.is_dir():
        return "is not a directory"
    names = os.listdir(path)
    if not names:
        return None
    if MANIFEST not in names:
        return f"is not a sortpack output (no {MANIFEST}; it holds {_some(names)})"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        fmt = manifest.get("format")
    except (OSError, ValueError, AttributeError) as exc:
        return f"has an unreadable {MANIFEST} ({one_line(exc)})"
    if fmt not in KIND_OF_FORMAT:
        return f"is not a sortpack output ({MANIFEST} says format {fmt!r})"
    held = nested and HOLDOUT_DIR in names and isinstance(manifest.get("holdout"), dict) and (
        (path / HOLDOUT_DIR).is_dir() and not (path / HOLDOUT_DIR).is_symlink())
    foreign = sorted(n for n in names if n != MANIFEST and not (_OWN_FILES.match(n) and (path / n).is_file())
                     and not (held and n == HOLDOUT_DIR))
    if foreign:
        return f"holds files sortpack did not write ({_some(foreign)})"
    if held:
        why = is_sortpack_output(path / HOLDOUT_DIR, nested=False)
        if why is not None:
            return f"has a {HOLDOUT_DIR}/ that {why}"
    return None


def _some(names: list[str]) -> str:
    names = sorted(names)
    shown = ", ".join(_show(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def check_output(path: Path, overwrite: bool, inputs: list[str] | tuple[str, ...] = ()) -> None:
    """Raise SortpackError when the output cannot or must not be written; touch nothing.

    Refused: ``-o`` naming the current directory or one holding it, ``-o`` equal to or holding
    an input, an existing output without ``--overwrite``, ``--overwrite`` of anything but an
    empty directory or a sortpack output, and a parent that is not a writable directory.
    """
    shown = _show(path)
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        raise SortpackError(f"{shown}: the output name is not valid UTF-8") from None
    real = os.path.realpath(path)
    if path.name in ("", ".", "..") or _inside(os.getcwd(), real):
        raise SortpackError(f"-o {shown}: the output would replace the current directory or one holding it; "
                            f"name a new directory")
    for item in inputs:
        if os.path.lexists(item) and _inside(os.path.realpath(item), real):
            raise SortpackError(f"-o {shown}: the output is or holds the input {_show(item)}; "
                                f"write it somewhere else")
    if os.path.lexists(path):
        if not overwrite:
            raise SortpackError(f"{shown}: output exists (use --overwrite to replace it)")
        why = is_sortpack_output(path)
        if why is not None:
            raise SortpackError(f"{shown}: {why}; --overwrite replaces only an empty directory or a "
                                f"sortpack output, so nothing was touched")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise SortpackError(f"{shown}: {_show(ancestor)} is not a directory")
    _probe_writable(path, ancestor)


def _probe_writable(path: Path, ancestor: Path) -> None:
    """Raise unless a directory can be made (and removed) in ``ancestor``: the job's first write."""
    try:
        probe = tempfile.mkdtemp(prefix=f".{path.name}.probe-", dir=ancestor)
        os.rmdir(probe)
    except OSError as exc:
        raise SortpackError(f"{_show(path)}: cannot write the output in {_show(ancestor)} "
                            f"({exc.strerror or one_line(exc)})") from None


# --- the owner of a temporary directory ------------------------------------------------

def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:40] or "localhost"


def _stat(pid: int) -> tuple[str, int]:
    """Return process ``pid``'s state letter and its start time in clock ticks since boot (("", 0) where unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (OSError, ValueError, IndexError):
        return "", 0


def _start_time(pid: int) -> int:
    """Return the start time of process ``pid`` in clock ticks since boot (0 where unknown)."""
    return _stat(pid)[1]


def owner_tag() -> str:
    """Return ``PID-START@HOST`` of this process, as temporary directory names carry it."""
    pid = os.getpid()
    return f"{pid}-{_start_time(pid)}@{_host()}"


def _owner_alive(pid: int, start: int, host: str) -> bool | None:
    """Return whether the owner process runs (None: on another host, which cannot be checked)."""
    if host != _host():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    # a zombie (killed, not yet reaped by its parent) or dead process runs no more; a live pid whose start time
    # differs is a new process that reused the number
    state, now = _stat(pid)
    if state in ("Z", "X", "x"):
        return False
    return not (start and now and now != start)


def _temporaries(path: Path):
    """Yield (entry, kind, pid, start, host) for the tagged tmp/old siblings of ``path``."""
    pattern = re.compile(r"^\." + re.escape(path.name) + r"\.(tmp|old)-[0-9a-f]{12}-(\d+)-(\d+)@([A-Za-z0-9.-]+)$")
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for entry in entries:
        m = pattern.match(entry.name)
        if m and entry.is_dir(follow_symlinks=False):
            yield Path(entry.path), m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)


def sweep_stale(path: Path) -> list[str]:
    """Remove the temporaries of dead jobs beside ``path``; return one line per action.

    A ``.NAME.old-*`` directory holds a previous output that a killed ``--overwrite`` had
    moved aside (the two-rename fallback): when ``path`` is missing it is moved back.
    Temporaries of live jobs, of jobs on other hosts, and anything not named by sortpack
    are left alone.
    """
    lines = []
    stale = []
    for tmp, kind, pid, start, host in _temporaries(path):
        alive = _owner_alive(pid, start, host)
        if alive is False:
            stale.append((tmp, kind, pid))
        elif alive is None:
            lines.append(f"sortpack: left {_show(tmp)}: written by a job on host {host} (pid {pid}), which "
                         f"cannot be checked from here; remove it once that job has ended")
    # the newest previous output first: it is the one a killed replacement moved aside
    for tmp, kind, pid in sorted(stale, key=lambda t: (t[1] != "old", -_mtime(t[0]))):
        if kind == "old" and not os.path.lexists(path) and is_sortpack_output(tmp) is None:
            try:
                os.rename(tmp, path)
                lines.append(f"sortpack: restored the previous output {_show(path)} from {_show(tmp.name)} "
                             f"(a replacing job, pid {pid}, was killed between its two renames)")
                continue
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.lexists(tmp):
            lines.append(f"sortpack: removed {_show(tmp)}, left by a killed job (pid {pid})")
    return lines


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0
