"""The rows a rank received for its data shards: in memory up to a budget, spilled to mapped Arrow files past it."""
from __future__ import annotations

import mmap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ...errors import SortpackError, one_line
from ...row_store import RowStore, piece_cuts


@dataclass
class MappedBatch:
    """A record batch of a spill file: the last output position it holds, the file's map, and its byte range."""

    last: int
    mm: mmap.mmap
    first: int
    end: int


class ReceivedRows:
    """Rows received by this rank, one ``RowStore`` per column: in memory up to ``budget`` bytes, spilled past it.

    Rows are numbered in arrival order; ``pos`` holds each one's output position and
    ``sizes`` its bytes. Rows that stay on their reader's rank are registered in place (no
    copy) when they are at least half of their round, and then count the bytes of the whole
    segments they keep alive, so what is counted is what is held.

    A spill writes the pending rows sorted by output position, in record batches of at most
    ``piece`` bytes (under the 2 GiB of 32-bit offsets, ``row_store.piece_bytes``), and maps
    the file back; the spilled rows are renumbered in that order. The shards are written in
    position order, so each spill file is read front to back and ``release_below`` hands
    the pages of its finished batches back to the kernel: the mapped spill files never
    stay resident as a whole.
    """

    def __init__(self, directory: Path, rank: int, budget: int, schema: pa.Schema, piece: int):
        self.directory, self.rank, self.budget, self.schema = directory, rank, budget, schema
        self.piece = max(1, piece)
        self.stores = {f.name: RowStore(f.type) for f in schema}
        self.pos: list[np.ndarray] = []
        self.sizes: list[np.ndarray] = []
        self.rows = self.spilled_rows = 0  # rows [0, spilled_rows) live in spill files
        self.pending_bytes = 0
        self.spills: list[Path] = []
        self._pending_entry = 0  # pos/sizes entries from here on are not spilled
        self._mapped: list[MappedBatch] = []  # the spill batches still resident
        self.spill_batches = 0
        self.spill_s = 0.0

    def add(self, columns: dict[str, pa.Array | pa.ChunkedArray], pos: np.ndarray, sizes: np.ndarray,
            rows: np.ndarray | None = None, held: int | None = None) -> None:
        """Register rows ``rows`` (all when None) of ``columns`` (name -> array), with their positions and bytes.

        ``held``: the bytes these rows keep in memory when more than their own (rows registered in place).
        """
        if len(pos) == 0:
            return
        for name, store in self.stores.items():
            store.add(columns[name], rows)
        self.pos.append(np.asarray(pos, dtype=np.int64))
        self.sizes.append(np.asarray(sizes, dtype=np.int64))
        self.rows += len(pos)
        self.pending_bytes += int(self.sizes[-1].sum()) if held is None else int(held)
        if self.pending_bytes > self.budget:
            self._spill()

    def _spill(self) -> None:
        """Write the pending rows to a spill file in position order and keep them mapped from it."""
        t0 = time.perf_counter()
        path = self.directory / f".spill-{self.rank:05d}-{len(self.spills):05d}.arrow"
        first_entry = self._pending_entry  # the entries added since the last spill
        pos = np.concatenate(self.pos[first_entry:])
        sizes = np.concatenate(self.sizes[first_entry:])
        order = np.argsort(pos, kind="stable")
        pos, sizes = pos[order], sizes[order]
        rows = self.spilled_rows + order
        cuts = piece_cuts(sizes, self.piece)
        self.spills.append(path)
        try:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, self.schema) as writer:
                for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
                    writer.write_table(self.gather(rows[a:b]))
        except (OSError, pa.ArrowException) as exc:
            raise SortpackError(f"{path}: cannot write the spill file ({one_line(exc)})") from None
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        buf = pa.py_buffer(mm)
        reader = pa.ipc.open_file(pa.BufferReader(buf))  # zero-copy: the batches point into the map
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self.spill_batches += len(batches)
        for name, store in self.stores.items():
            store.drop_from(self.spilled_rows)
            store.add(pa.chunked_array([bt.column(name) for bt in batches], self.schema.field(name).type))
        for b, batch in zip(cuts[1:].tolist(), batches):
            first, end = _byte_range(batch, buf.address)
            self._mapped.append(MappedBatch(int(pos[b - 1]), mm, first, end))
        self.pos[first_entry:] = [pos]
        self.sizes[first_entry:] = [sizes]
        self._pending_entry = len(self.pos)
        self.spilled_rows, self.pending_bytes = self.rows, 0
        self.spill_s += time.perf_counter() - t0

    def release_below(self, position: int) -> None:
        """Drop from memory the mapped spill batches whose rows all lie before output ``position``."""
        page = mmap.PAGESIZE
        keep = []
        for entry in self._mapped:
            if entry.last >= position:
                keep.append(entry)
                continue
            lo, hi = entry.first // page * page, min(len(entry.mm), -(-entry.end // page) * page)
            if hi > lo:
                # a shared file map: a page dropped by mistake is read back from the file, never lost
                entry.mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        self._mapped = keep

    def gather(self, rows: np.ndarray) -> pa.Table:
        """Return received rows ``rows`` (arrival numbers) as one table of single-chunk columns."""
        return pa.Table.from_arrays([self.stores[f.name].gather(rows) for f in self.schema], schema=self.schema)

    def remove(self) -> None:
        """Drop every row and delete the spill files."""
        self.stores = {}
        self._mapped = []
        for path in self.spills:
            path.unlink(missing_ok=True)


def _byte_range(batch: pa.RecordBatch, base: int) -> tuple[int, int]:
    """Return the (first, end) byte offsets from ``base`` spanned by a batch's buffers."""
    spans = [(buf.address - base, buf.address - base + buf.size) for col in batch.columns
             for buf in col.buffers() if buf is not None and buf.size != 0]
    if not spans:
        return 0, 0
    return min(a for a, _ in spans), max(b for _, b in spans)
