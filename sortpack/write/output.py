"""Output directories that appear whole or not at all: a temporary sibling, swapped into place on commit."""
from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

from ..errors import SortpackError
from ..format.manifest import write_manifest
from ..parallel import Comm, fault_point
from . import termination

_MADE_PARENTS: set[Path] = set()  # missing parents this process created for outputs


class OutputDir:
    """An output directory that appears only when complete.

    Every rank writes into one temporary sibling, named with its owner (rank 0's pid, start
    time and host) so that a later job can remove it if this one is killed; ``commit`` has
    rank 0 write the manifest and swap it into place atomically (replacing an old output only
    with ``overwrite``, and only one that sortpack wrote). Missing parent directories are
    created with the temporary one, and removed again by ``discard``. Before any work, rank 0
    checks the output (``output_guard.check_output``; ``inputs`` must not be inside it) and
    removes the temporaries of dead jobs beside it.
    """

    def __init__(self, comm: Comm, path: str | os.PathLike, overwrite: bool = False,
                 inputs: list[str] | tuple[str, ...] = (), inside: OutputDir | None = None):
        from ..inputs.objects import url_scheme
        from .output_guard import check_output, owner_tag, sweep_stale

        self.comm = comm
        self.path = Path(path)
        self.overwrite = overwrite
        err = None
        if comm.is_root():
            try:
                if url_scheme(str(path)) is not None:  # Path() would fold "s3://b/x" into a local "s3:/b/x"
                    raise SortpackError(f"-o {path}: sortpack writes its output to a local (POSIX) directory; "
                                        "URLs are read as inputs only")
                for line in sweep_stale(self.path):
                    print(line, file=sys.stderr, flush=True)
                check_output(self.path, overwrite, inputs)
            except SortpackError as exc:
                err = exc
        comm.check(err)
        name = comm.bcast_obj(f"{uuid.uuid4().hex[:12]}-{owner_tag()}" if comm.is_root() else None)
        self.tmp = self.path.parent / f".{self.path.name}.tmp-{name}"
        # ``inside``: the temporary lives in another output's temporary (run's kept measurements),
        # so a killed or signalled job leaves one temporary, not two
        self.inside = inside
        self.nested: list[OutputDir] = []  # outputs whose temporaries live in this one's
        if inside is not None:
            self.tmp = inside.tmp / f".{self.path.name}.tmp"
            inside.nested.append(self)
        self._created = False
        self._cleanup_key: int | None = None

    def ensure(self) -> Path:
        """Create the temporary directory (and missing parents; collective) and return it."""
        if not self._created:
            if self.inside is not None:
                self.inside.ensure()
            err = None
            if self.comm.is_root():
                missing = [p for p in reversed(self.path.parents) if not p.exists()]
                try:
                    for p in missing:
                        p.mkdir(exist_ok=True)
                        _MADE_PARENTS.add(p)
                    self.tmp.mkdir()
                    self._cleanup_key = termination.register(self._remove_on_signal, self._claim_name())
                except OSError as exc:
                    err = SortpackError(f"{self.path}: cannot create the output ({' '.join(str(exc).split())})")
            self.comm.check(err)
            made = self.comm.bcast_obj(sorted(str(p) for p in _MADE_PARENTS if p in self.path.parents))
            if not self.comm.is_root():
                # every rank removes the temporary (and the parents made for it) when it alone is signalled: the
                # launcher may then SIGKILL the others, rank 0 included, before they can
                _MADE_PARENTS.update(Path(p) for p in made)
                self._cleanup_key = termination.register(self._remove_on_signal, self._claim_name())
            self._created = True
        return self.tmp

    def _claim_name(self) -> str | None:
        """Return the name every rank claims to print a signal's line (None: a temporary inside another's)."""
        return None if self.inside is not None else self.tmp.name

    def _remove_on_signal(self) -> str | None:
        """Remove the temporary (and the parents made for it); return its name when it was there."""
        if not os.path.lexists(self.tmp):
            return None
        for _ in range(3):  # another thread may still be adding a file
            shutil.rmtree(self.tmp, ignore_errors=True)
        _remove_made_parents()
        return self.tmp.name

    def commit(self, manifest: dict) -> dict | None:
        """Write the manifest and move the directory into place; return the manifest on rank 0.

        ``--overwrite`` is checked again at rename time: when another job created the output
        since this one started, this job fails with one line and removes its temporary
        directory instead of replacing (or merging into) the other's output.
        """
        self.ensure()
        if not self.comm.is_root():
            self._forget()  # from here rank 0 alone decides: a rename may be under way
        self.comm.barrier()
        written, err = None, None
        if self.comm.is_root():
            old = None
            for child in self.nested:  # never part of this output
                shutil.rmtree(child.tmp, ignore_errors=True)
            try:
                written = write_manifest(self.tmp, manifest)
                old = self._rename_into_place()
            except (SortpackError, OSError) as exc:
                if not isinstance(exc, SortpackError):
                    exc = SortpackError(f"{self.path}: cannot move the output into place "
                                        f"({' '.join(str(exc).split())})")
                err = exc
                shutil.rmtree(self.tmp, ignore_errors=True)
            finally:
                self._forget()
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)  # the replaced output; a kill leaves it to the next job
        self.comm.check(err)
        _MADE_PARENTS.difference_update(self.path.parents)  # they hold an output now
        return written

    def commit_alone(self, manifest: dict) -> bool:
        """Write the manifest and move the directory into place from this rank alone; return whether it moved.

        For a job that is failing: the shards were all written before (``write_samples(...,
        commit=False)`` ends with a barrier), and the rank that fails keeps them without the
        other ranks, which may be blocked or aborted. Best effort: any error leaves the
        temporary for ``discard`` (or the next job) and returns False.
        """
        try:
            write_manifest(self.tmp, manifest)
            self._rename_into_place()
        except (SortpackError, OSError):
            return False
        finally:
            self._forget()
        _MADE_PARENTS.difference_update(self.path.parents)
        return True

    def _forget(self) -> None:
        if self._cleanup_key is not None:
            termination.unregister(self._cleanup_key)
            self._cleanup_key = None

    def _rename_into_place(self) -> Path | None:
        """Swap the temporary into place; return where the replaced output now is (None: nothing replaced).

        With an existing output, ``renameat2(RENAME_EXCHANGE)`` swaps the two in one step, so
        the replaced output ends up under the temporary's name (which names this job as
        owner); where the system lacks it, the old output is renamed aside first
        (``.NAME.old-*``, also owner-named) and a kill between the two renames is undone by
        the next job into the same output.
        """
        from ..write.atomic_rename import exchange, move_new
        from .output_guard import is_sortpack_output

        exists = SortpackError(f"{self.path}: output appeared while this job ran (another job wrote it; "
                               f"use --overwrite to replace it)")
        with termination.critical():
            if os.path.lexists(self.path):
                if not self.overwrite:
                    raise exists
                why = is_sortpack_output(self.path)
                if why is not None:
                    raise SortpackError(f"{self.path}: appeared while this job ran and {why}; --overwrite "
                                        f"replaces only an empty directory or a sortpack output")
                if exchange(self.tmp, self.path):
                    return self.tmp
                old = self.path.parent / self.tmp.name.replace(".tmp-", ".old-", 1)
                os.rename(self.path, old)
                fault_point(self.comm, "between_renames")
                try:
                    self._move_new()
                except BaseException:
                    os.rename(old, self.path)
                    raise
                return old
            try:
                if not move_new(self.tmp, self.path):
                    self._move_new()
            except FileExistsError:
                raise exists from None
            return None

    def _move_new(self) -> None:
        exists = SortpackError(f"{self.path}: output appeared while this job ran (another job wrote it; "
                               f"use --overwrite to replace it)")
        try:
            # rename(2) replaces an empty directory silently: make sure there is none
            if os.path.lexists(self.path):
                raise exists
            os.rename(self.tmp, self.path)
        except OSError:
            if os.path.lexists(self.path):
                raise exists from None  # lost the race to another job's rename
            raise

    def discard(self) -> None:
        """Remove the temporary directory and the parents it created (rank 0, best effort)."""
        if self.comm.is_root():
            if self.tmp.exists():
                shutil.rmtree(self.tmp, ignore_errors=True)
            _remove_made_parents()
        self._forget()


class NestedOutput:
    """A plan directory written inside another output's temporary directory (the held-out plan).

    It has what ``write_index`` uses of an ``OutputDir`` (``path``, ``ensure``, ``commit``):
    it appears, is replaced and is removed with its parent, whose rename makes both appear
    at once; ``commit`` only writes its manifest.
    """

    def __init__(self, parent: OutputDir, name: str):
        self.comm = parent.comm
        self.parent = parent
        self.name = name
        self.path = parent.path / name  # where it will be: what messages name

    def ensure(self) -> Path:
        """Create the directory inside the parent's temporary one (collective) and return it."""
        directory = self.parent.ensure() / self.name
        err = None
        if self.comm.is_root():
            try:
                directory.mkdir(exist_ok=True)
            except OSError as exc:
                err = SortpackError(f"{self.path}: cannot create the output ({' '.join(str(exc).split())})")
        self.comm.check(err)
        return directory

    def commit(self, manifest: dict) -> dict | None:
        """Write the manifest (rank 0); return it on rank 0. The parent's commit moves it into place."""
        directory = self.ensure()
        self.comm.barrier()
        written, err = None, None
        if self.comm.is_root():
            try:
                written = write_manifest(directory, manifest)
            except OSError as exc:
                err = SortpackError(f"{self.path}: cannot write the manifest ({' '.join(str(exc).split())})")
        self.comm.check(err)
        return written


PlanDir = OutputDir | NestedOutput  # where write_index writes a plan


def _remove_made_parents() -> None:
    # parents are shared by a job's outputs (run --keep-intermediate): each discard
    # removes those that are empty by now, deepest first
    for p in sorted(_MADE_PARENTS, key=lambda q: len(q.parts), reverse=True):
        try:
            p.rmdir()  # only while empty: another job may have written there since
            _MADE_PARENTS.discard(p)
        except OSError:
            pass
