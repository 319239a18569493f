"""Output files that appear whole or not at all: written in a temporary sibling directory, moved into place last.

An export writes files, not a directory (``PREFIX.bin`` and ``PREFIX.idx``, ``FILE.parquet``).
Every rank writes into one temporary directory beside the first file, named like an
``OutputDir``'s (``.NAME.tmp-TOKEN-PID-START@HOST``), so a signal removes it
(``termination``) and a later job into the same output removes it when its owner is dead
(``output_guard.sweep_stale``). ``commit`` has rank 0 move the files into place in the order
given (data before the index that names it), then remove the directory.

An existing file is replaced only with ``overwrite``, and only when ``replaceable`` says it is
one of the kind the export writes (a Megatron dataset, a Parquet file sortpack wrote): a
user's other file is never replaced.
"""
from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from ..errors import SortpackError, one_line
from ..parallel import Comm
from . import termination


class FileOutputs:
    """Output files written in a temporary directory and moved into place together by ``commit``.

    ``paths``: the files, in the order they are moved into place; ``replaceable(path)``:
    why an existing file may not be replaced (None: it may, with ``overwrite``); ``inside``:
    directories the files must not be in (the plan read).
    """

    def __init__(self, comm: Comm, paths: list[Path], overwrite: bool,
                 replaceable: Callable[[Path], str | None], inside: tuple[Path, ...] = ()):
        from .output_guard import owner_tag, sweep_stale

        self.comm = comm
        self.paths = [Path(p) for p in paths]
        self.overwrite = overwrite
        self.replaceable = replaceable
        err = None
        if comm.is_root():
            try:
                for line in sweep_stale(self.paths[0]):
                    print(line, file=sys.stderr, flush=True)
                for p in self.paths:
                    self._check(p, inside)
            except SortpackError as exc:
                err = exc
        comm.check(err)
        name = comm.bcast_obj(f"{uuid.uuid4().hex[:12]}-{owner_tag()}" if comm.is_root() else None)
        first = self.paths[0]
        self.tmp = first.parent / f".{first.name}.tmp-{name}"
        self._made: list[Path] = []  # parents this job created
        self._key: int | None = None

    def _check(self, path: Path, inside: tuple[Path, ...]) -> None:
        """Raise unless ``path`` may be written (a file, not inside the plan, replaced only as allowed)."""
        from ..inputs.objects import url_scheme

        if url_scheme(str(path)) is not None:
            raise SortpackError(f"-o {path}: sortpack writes its output to a local (POSIX) path; URLs are read only")
        real = os.path.realpath(path)
        for d in inside:
            if real == os.path.realpath(d) or real.startswith(os.path.realpath(d).rstrip(os.sep) + os.sep):
                raise SortpackError(f"-o {path}: inside the plan {d}; write the export somewhere else")
        if os.path.isdir(path):
            raise SortpackError(f"{path}: is a directory; the export writes a file there")
        if os.path.lexists(path):
            if not self.overwrite:
                raise SortpackError(f"{path}: output exists (use --overwrite to replace it)")
            why = self.replaceable(path)
            if why is not None:
                raise SortpackError(f"{path}: {why}; --overwrite replaces only what this export writes, so nothing "
                                    "was touched")
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
            raise SortpackError(f"{path}: cannot write the output in {ancestor}")

    def ensure(self) -> Path:
        """Create the temporary directory (and missing parents; collective) and return it."""
        if self._key is None:
            err = None
            if self.comm.is_root():
                try:
                    missing = [p for p in reversed(self.tmp.parents) if not p.exists()]
                    for p in missing:
                        p.mkdir(exist_ok=True)
                        self._made.append(p)
                    self.tmp.mkdir()
                except OSError as exc:
                    err = SortpackError(f"{self.paths[0]}: cannot create the output ({one_line(exc)})")
            self.comm.check(err)
            # every rank removes them on a signal: the launcher may SIGKILL rank 0 before it can
            self._made = [Path(p) for p in self.comm.bcast_obj([str(p) for p in self._made])]
            self._key = termination.register(self._remove, self.tmp.name)
        return self.tmp

    def temp(self, path: Path) -> Path:
        """Return where ``path`` is written until ``commit`` (a file of the temporary directory)."""
        return self.ensure() / Path(path).name

    def _remove(self) -> str | None:
        """Remove the temporary directory and the parents made for it; return its name when it was there."""
        if not os.path.lexists(self.tmp):
            return None
        shutil.rmtree(self.tmp, ignore_errors=True)
        for p in reversed(self._made):
            try:
                p.rmdir()
            except OSError:
                break
        return self.tmp.name

    def commit(self) -> None:
        """Move every file into place (rank 0, in ``paths`` order) and remove the temporary directory (collective)."""
        self.ensure()
        self.comm.barrier()
        err = None
        if self.comm.is_root():
            try:
                with termination.critical():
                    for p in self.paths:
                        self._move(self.temp(p), p)
            except (SortpackError, OSError) as exc:
                err = exc if isinstance(exc, SortpackError) else \
                    SortpackError(f"{self.paths[0]}: cannot move the output into place ({one_line(exc)})")
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)
        self._forget()
        self.comm.check(err)

    def _move(self, src: Path, dst: Path) -> None:
        """Rename ``src`` to ``dst``; replace an existing ``dst`` only with ``overwrite`` and when allowed."""
        from .atomic_rename import move_new

        appeared = SortpackError(f"{dst}: output appeared while this job ran (another job wrote it; use "
                                 "--overwrite to replace it)")
        if os.path.lexists(dst):
            if not self.overwrite:
                raise appeared
            why = self.replaceable(dst)
            if why is not None:
                raise SortpackError(f"{dst}: appeared while this job ran and {why}")
            os.replace(src, dst)
            return
        try:
            if move_new(src, dst):
                return
        except FileExistsError:
            raise appeared from None
        if os.path.lexists(dst):
            raise appeared
        os.rename(src, dst)

    def discard(self) -> None:
        """Remove the temporary directory and the parents it created (rank 0, best effort)."""
        if self.comm.is_root():
            self._remove()
        self._forget()

    def _forget(self) -> None:
        if self._key is not None:
            termination.unregister(self._key)
            self._key = None
