"""The exchange: Alltoallv rounds that move every stored row from the rank reading it to the rank writing its shard."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ...errors import SortpackError
from ...parallel import Comm
from ...partition import rank_of
from ...row_store import RowStore, from_raw_pieces, gather_pieces, piece_bytes
from .plan import MemoryBudget
from .rows import InputRows, column_row_bytes, row_bytes
from .spill import ReceivedRows


@dataclass
class QueuedTable:
    """A unit's rows read and waiting to be sent; rows before ``first`` are sent."""

    table: pa.Table
    first: int = 0


@dataclass(frozen=True)
class RoundRows:
    """The rows one round sends, in reading order: each one's output position, bytes and destination rank."""

    pos: np.ndarray
    sizes: np.ndarray
    dest: np.ndarray


@dataclass(frozen=True)
class Segment:
    """Rows ``[first, end)`` of a read table, sent in one round."""

    table: pa.Table
    first: int
    end: int


def exchange(comm: Comm, reader: InputRows, received: ReceivedRows, owner_starts: np.ndarray,
             memory: MemoryBudget) -> int:
    """Return the rounds it took to send every local row to its position's owner.

    A round moves at most ``memory.round`` bytes per rank, sent and received.
    """
    budget, limit = memory.round, memory.limit
    queue: list[QueuedTable] = []  # in reading order
    pos, sizes = np.zeros(0, np.int64), np.zeros(0, np.int64)
    rounds = 0
    while True:
        err = None
        try:
            # read whole units until a round's worth of bytes waits (fewer, larger rounds)
            while (not queue or int(sizes.sum()) < budget) and not reader.done():
                more, more_pos = reader.next_table()
                more_sizes = row_bytes(more)
                if len(more_sizes) and more_sizes.max() > budget:
                    worst = max(more.column_names, key=lambda c: int(column_row_bytes(more.column(c)).max()))
                    raise SortpackError(
                        f"column {worst!r}: a row of {int(more_sizes.max())} bytes does not fit the exchange "
                        f"budget of {budget} bytes per round (an eighth of --memory-limit {limit}); "
                        "raise --memory-limit")
                if more.num_rows:
                    queue.append(QueuedTable(more))
                    pos, sizes = np.concatenate((pos, more_pos)), np.concatenate((sizes, more_sizes))
        except SortpackError as exc:
            err = exc
        comm.check(err)
        left = len(pos)
        if comm.allreduce(int(left > 0), "max") == 0:
            break
        # the longest prefix under the budget, halved until no rank receives more than it
        take = max(1, int(np.searchsorted(np.cumsum(sizes), budget, side="right"))) if left else 0
        while True:
            dest = rank_of(pos[:take], owner_starts)
            send_bytes = np.bincount(dest, weights=sizes[:take], minlength=comm.size).astype(np.int64)
            recv_bytes = comm.exchange_counts(send_bytes)
            over, can_shrink = comm.allreduce(np.array([int(recv_bytes.sum() > budget), int(take > 1)]), "max")
            if not (over and can_shrink):
                break
            take = max(1, take // 2) if take else 0
        segments = _take_queue(queue, take)
        _send_round(comm, received, segments, RoundRows(pos[:take], sizes[:take], dest))
        pos, sizes = pos[take:], sizes[take:]
        rounds += 1
    return rounds


def _take_queue(queue: list[QueuedTable], take: int) -> list[Segment]:
    """Return the next ``take`` queued rows as segments and drop them from the queue."""
    segments = []
    while take > 0:
        table, first = queue[0].table, queue[0].first
        end = min(table.num_rows, first + take)
        segments.append(Segment(table, first, end))
        take -= end - first
        if end == table.num_rows:
            queue.pop(0)
        else:
            queue[0].first = end
    return segments


def _send_round(comm: Comm, received: ReceivedRows, segments: list[Segment], sent: RoundRows) -> None:
    """Move one round's rows (``segments``, as ``sent`` places them) to their owners: Alltoallv of the rows'
    bytes, column by column."""
    pos, sizes, dest = sent.pos, sent.sizes, sent.dest
    schema = received.schema
    stores = {f.name: RowStore(f.type) for f in schema}
    for seg in segments:
        for name, store in stores.items():
            store.add(seg.table.column(name), np.arange(seg.first, seg.end))
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=comm.size)
    starts = np.concatenate(([0], np.cumsum(counts)))
    r = comm.rank
    own = order[starts[r]:starts[r + 1]]  # ascending: the stable sort keeps reading order
    others = np.concatenate((order[:starts[r]], order[starts[r + 1]:]))
    rows_out = counts.copy()
    rows_out[r] = 0
    # a column's bytes go raw (lengths and bytes) when every rank can gather them so, else as IPC
    raw = comm.allreduce(np.array([int(not s.raw) for s in stores.values()] or [0]), "max") == 0
    meta = {"pos": pos[others], "size": sizes[others]}
    payloads = []
    for k, (name, store) in enumerate(stores.items()):
        if raw[k]:
            length, data, valid = store.gather_raw(others)
            meta[f"len{k}"] = length
            meta[f"valid{k}"] = np.ones(len(others), np.uint8) if valid is None else valid.astype(np.uint8)
            byte_counts = np.bincount(dest[others], weights=length, minlength=comm.size).astype(np.int64)
        else:
            data, byte_counts = _ipc_by_destination(store, others, sent, comm.size, schema.field(name))
        payloads.append((data, byte_counts))
    got = comm.alltoallv_many(meta, rows_out)
    columns = {}
    for k, (name, (data, byte_counts)) in enumerate(zip(stores, payloads)):
        recv_counts = comm.exchange_counts(byte_counts)
        buf = comm.alltoallv(data, byte_counts, recv_counts)
        del data
        field_ = schema.field(name)
        if raw[k]:
            valid = got[f"valid{k}"].astype(bool)
            # a round may exceed 2 GiB (a limit over 16 GiB): offsets of pieces under it
            columns[name] = from_raw_pieces(field_.type, got[f"len{k}"], buf, None if valid.all() else valid,
                                            piece_bytes())
        else:
            columns[name] = _from_ipc(buf, recv_counts, field_)
    payloads.clear()
    received.add(columns, got["pos"], got["size"])
    _keep_own(received, segments, stores, own, sent)


def _keep_own(received: ReceivedRows, segments: list[Segment], stores: dict[str, RowStore], own: np.ndarray,
              sent: RoundRows) -> None:
    """Register the round's rows that stay on this rank (``own``, of the rows ``sent`` in the round)."""
    pos, sizes = sent.pos, sent.sizes
    if len(own) == 0:
        return
    if 2 * len(own) >= len(sent.dest):  # most rows stay: register them where they are read
        at = 0
        for seg in segments:
            rows = seg.end - seg.first
            mine = own[(own >= at) & (own < at + rows)]
            if len(mine):  # they keep the whole segment alive: count it
                received.add({n: seg.table.column(n) for n in stores}, pos[mine], sizes[mine],
                             rows=seg.first + mine - at, held=int(sizes[at:at + rows].sum()))
            at += rows
    else:  # a few rows stay: copy them, so the rows that left do not stay in memory with them
        limit = piece_bytes()
        received.add({n: gather_pieces(s, own, sizes[own], limit) for n, s in stores.items()}, pos[own],
                     sizes[own])


def _ipc_by_destination(store: RowStore, rows: np.ndarray, sent: RoundRows, size: int,
                        field_: pa.Field) -> tuple[np.ndarray, np.ndarray]:
    """Return the ``rows`` of a column that cannot go raw as one IPC stream per destination, and each stream's bytes.

    A stream holds one record batch per piece of at most ``piece_bytes()`` (estimated by the rows' sizes).
    """
    dest, sizes = sent.dest[rows], sent.sizes[rows]
    sink, counts = pa.BufferOutputStream(), np.zeros(size, dtype=np.int64)
    schema = pa.schema([field_])
    limit = piece_bytes()
    for p in range(size):
        to_p = dest == p
        mine = rows[to_p]
        if len(mine) == 0:
            continue
        at = sink.tell()
        with pa.ipc.new_stream(sink, schema) as writer:
            column = gather_pieces(store, mine, sizes[to_p], limit)
            writer.write_table(pa.Table.from_arrays([column], schema=schema))
        counts[p] = sink.tell() - at
    return np.frombuffer(sink.getvalue(), dtype=np.uint8), counts


def _from_ipc(buf: np.ndarray, counts: np.ndarray, field_: pa.Field) -> pa.Array:
    """Return the rows of the IPC streams received from every rank, in rank order, as one chunked array."""
    parts, at = [], 0
    for c in counts.tolist():
        if c:
            table = pa.ipc.open_stream(pa.py_buffer(buf[at:at + c])).read_all()
            parts.extend(table.column(0).chunks)
            at += c
    # not concatenated: the round's rows may hold more than 32-bit offsets address
    return pa.chunked_array(parts, field_.type)
