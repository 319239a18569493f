"""Shard files: atomic output directories, Arrow IPC shards written by their owner ranks,
and reads of global row ranges."""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import SortpackError, one_line
from ..parallel import Comm, fault_point
from ..partition import shard_starts
from ..progress import Progress
from ..write import termination
from .integrity import check_index_shard, check_structure, member_path
from .kinds import ROWS_PER_SHARD  # noqa: F401 - re-exported for callers of the old home
from .manifest import read_manifest, shard_name, write_manifest

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
                 inputs: list[str] | tuple[str, ...] = ()):
        from ..write.output_guard import check_output, owner_tag, sweep_stale

        self.comm = comm
        self.path = Path(path)
        self.overwrite = overwrite
        err = None
        if comm.is_root():
            try:
                for line in sweep_stale(self.path):
                    print(line, file=sys.stderr, flush=True)
                check_output(self.path, overwrite, inputs)
            except SortpackError as exc:
                err = exc
        comm.check(err)
        name = comm.bcast_obj(f"{uuid.uuid4().hex[:12]}-{owner_tag()}" if comm.is_root() else None)
        self.tmp = self.path.parent / f".{self.path.name}.tmp-{name}"
        self._created = False
        self._cleanup_key: int | None = None

    def ensure(self) -> Path:
        """Create the temporary directory (and missing parents; collective) and return it."""
        if not self._created:
            err = None
            if self.comm.is_root():
                missing = [p for p in reversed(self.path.parents) if not p.exists()]
                try:
                    for p in missing:
                        p.mkdir(exist_ok=True)
                        _MADE_PARENTS.add(p)
                    self.tmp.mkdir()
                    self._cleanup_key = termination.register(self._remove_on_signal)
                except OSError as exc:
                    err = SortpackError(f"{self.path}: cannot create the output ({' '.join(str(exc).split())})")
            self.comm.check(err)
            self._created = True
        return self.tmp

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
        self.comm.barrier()
        written, err = None, None
        if self.comm.is_root():
            old = None
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
        from ..write.output_guard import is_sortpack_output

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
            self._forget()
            _remove_made_parents()


def _remove_made_parents() -> None:
    # parents are shared by a job's outputs (run --keep-intermediate): each discard
    # removes those that are empty by now, deepest first
    for p in sorted(_MADE_PARENTS, key=lambda q: len(q.parts), reverse=True):
        try:
            p.rmdir()  # only while empty: another job may have written there since
            _MADE_PARENTS.discard(p)
        except OSError:
            pass


def write_shard(path: Path, table: pa.Table) -> dict:
    """Write ``table`` as one-batch Arrow IPC file; return its ``bytes`` and ``sha256``."""
    batch = pa.RecordBatch.from_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                                        for c in table.columns], schema=table.schema)
    with pa.OSFile(str(path), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_batch(batch)
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def file_sha256(path: str | os.PathLike) -> str:
    """Return the hex sha256 of a file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_owned_shards(
    comm: Comm,
    out: OutputDir,
    kind: str,
    make_table,
    first_row: int,
    num_rows: int,
    total_rows: int,
    rows_per_shard: int,
    samples_in=None,
    starts: np.ndarray | None = None,
) -> list[dict]:
    """Write this rank's whole shards; return every shard's manifest entry on all ranks.

    This rank holds global rows ``[first_row, first_row + num_rows)``, which must be whole
    shards; ``make_table(a, b)`` returns local rows ``[a, b)`` as a table. Each shard is
    built on its own, so its bytes never depend on how rows were split between ranks.
    ``samples_in(a, b)`` (index only) counts the samples in local rows ``[a, b)``.
    ``starts`` gives the shard boundaries (default: every ``rows_per_shard`` rows).
    """
    directory = out.ensure()
    if starts is None:
        starts = shard_starts(total_rows, rows_per_shard)
    lo = int(np.searchsorted(starts, first_row))
    hi = int(np.searchsorted(starts, first_row + num_rows)) if num_rows else lo
    entries = []
    prog = Progress(f"write {kind}", num_rows, "micro-batches" if kind == "index" else "rows", job_total=total_rows)
    err = None
    for k in range(lo, hi):
        a, b = int(starts[k]) - first_row, int(starts[k + 1]) - first_row
        try:
            meta = write_shard(directory / shard_name(kind, k), make_table(a, b))
        except OSError as exc:  # a full disk, a quota, a file size limit: every rank stops together
            err = SortpackError(f"{out.path}: cannot write {shard_name(kind, k)} "
                                f"({exc.strerror or ' '.join(str(exc).split())})")
            break
        prog.update(b - a)
        nsamp = int(samples_in(a, b)) if samples_in is not None else b - a
        entries.append({"file": shard_name(kind, k), "first": int(starts[k]), "rows": b - a,
                        "num_samples": nsamp, **meta})
    prog.close()
    fault_point(comm, f"wrote_{kind}")
    comm.check(err)
    gathered = comm.allgather_obj(entries)
    return [e for part in gathered for e in part]


def open_shard(directory: str | os.PathLike, entry: dict, schema: dict | None = None,
               names: list[str] | None = None) -> pa.RecordBatch:
    """Return the memory-mapped record batch of one shard, checking its place, size and Arrow structure.

    ``schema`` (name to type string) or ``names`` is what the manifest says of its columns;
    see ``integrity.check_structure`` for what is checked (O(rows), offsets only).
    """
    path = member_path(directory, entry["file"])
    try:
        size = path.stat().st_size
    except OSError:
        raise SortpackError(f"{path}: shard listed in the manifest is missing") from None
    if size != entry["bytes"]:
        raise SortpackError(f"{path}: {size} bytes, the manifest says {entry['bytes']}")
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        if reader.num_record_batches == 1:
            batch = reader.get_batch(0)
        else:
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            for b in batches:  # each part is checked before concatenating reads its offsets
                check_structure(path, b, b.num_rows)
            if not batches:
                batch = pa.RecordBatch.from_pylist([], schema=reader.schema)
            else:
                batch = pa.Table.from_batches(batches, schema=reader.schema).combine_chunks().to_batches()[0]
    except (pa.ArrowException, OSError, IndexError) as exc:
        raise SortpackError(f"{path}: unreadable Arrow shard ({one_line(exc)})") from None
    check_structure(path, batch, int(entry["rows"]), schema, names)
    return batch


def read_rows(directory: str | os.PathLike, manifest: dict, start: int, stop: int,
              columns: list[str] | None = None) -> pa.Table:
    """Return global rows ``[start, stop)`` of a sortpack directory as one table.

    Each shard read is checked against the manifest (``open_shard``; an index shard's ids
    and counts too, ``integrity.check_index_shard``), not hashed: ``verify_shards`` does that.
    """
    parts = []
    for entry in manifest["shards"]:
        a, b = entry["first"], entry["first"] + entry["rows"]
        if b <= start or a >= stop:
            continue
        batch = open_shard(directory, entry, manifest.get("schema"))
        _check_rows(directory, manifest, entry, batch)
        if columns is not None:
            batch = batch.select(columns)
        lo, hi = max(start, a) - a, min(stop, b) - a
        parts.append(batch.slice(lo, hi - lo))
    if not parts:
        schema = _schema_of(directory, manifest)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        return schema.empty_table()
    return pa.Table.from_batches(parts)


def _check_rows(directory, manifest: dict, entry: dict, batch: pa.RecordBatch) -> None:
    """Raise when a shard's sample ids leave the input's rows (or, in an index, contradict its counts)."""
    path = Path(directory) / entry["file"]
    source_rows = int((manifest.get("source") or {}).get("num_rows", manifest["num_samples"]))
    if "sample_ids" in batch.schema.names:
        check_index_shard(path, batch, entry, source_rows)
    elif "sample_id" in batch.schema.names and batch.num_rows:
        ids = batch.column("sample_id").to_numpy()
        if int(ids.min()) < 0 or int(ids.max()) >= source_rows:
            raise SortpackError(f"{path}: a sample id outside the input's rows [0, {source_rows}) (corrupt shard)")


def _schema_of(directory, manifest) -> pa.Schema:
    if manifest["shards"]:
        return open_shard(directory, manifest["shards"][0]).schema
    from .schemas import schema_for

    return schema_for(manifest)


def verify_directory(directory: str | os.PathLike) -> list[str]:
    """Return a list of problems found by re-hashing every shard (empty when all is well)."""
    from .manifest import content_hash

    manifest = read_manifest(directory)
    problems = []
    expected_first = 0
    for entry in manifest["shards"]:
        try:
            path = member_path(directory, entry["file"])
        except SortpackError as exc:
            problems.append(f"{entry['file']}: {one_line(exc)}")
            continue
        if not path.is_file():
            problems.append(f"{entry['file']}: missing")
            continue
        if entry["first"] != expected_first:
            problems.append(f"{entry['file']}: starts at row {entry['first']}, expected {expected_first}")
        expected_first = entry["first"] + entry["rows"]
        size = path.stat().st_size
        if size != entry["bytes"]:
            # no hash of a file already known to be wrong (it may be a huge sparse file)
            problems.append(f"{entry['file']}: {size} bytes, manifest says {entry['bytes']}")
            continue
        if file_sha256(path) != entry["sha256"]:
            problems.append(f"{entry['file']}: sha256 mismatch")
        try:
            # e.g. an index's sample ids: int32 or int64, as the manifest's schema records
            batch = open_shard(directory, entry, manifest.get("schema"))
            _check_rows(directory, manifest, entry, batch)
        except SortpackError as exc:
            problems.append(f"{entry['file']}: {one_line(exc).removeprefix(str(path) + ': ')}")
        except Exception as exc:  # noqa: BLE001 - report any unreadable shard as a problem
            problems.append(f"{entry['file']}: unreadable ({exc})")
    if expected_first != manifest["num_rows"]:
        problems.append(f"shards hold {expected_first} rows, manifest says {manifest['num_rows']}")
    if content_hash(manifest) != manifest.get("content_hash"):
        problems.append("manifest content_hash does not match its contents")
    from .data_shards import verify_data

    return problems + verify_data(directory, manifest)
