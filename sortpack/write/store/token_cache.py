"""The token ids ``analyze`` computed while counting, kept on disk for ``run --store-tokens``."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import SortpackError, one_line
from ...inputs.fast_tokens import token_ids
from ...inputs.finetune import Encoded
from ...parallel import Comm
from ..output import OutputDir
from .options import LABELS_COLUMN, TOKENS_COLUMN


@dataclass(frozen=True)
class CachePart:
    """A run of one rank's cache file: its path, the global row of its first ids, its rows, its first in the file."""

    path: str
    first: int
    rows: int
    offset: int = 0


class TokenCache:
    """Token ids that ``analyze`` computed while counting (``run --store-tokens``), kept on disk.

    Each rank appends its ids in sample order to ``.tokens-RANK.arrow`` in the output's
    temporary directory; ``materialize`` reads them back by global row instead of
    tokenizing a second time. It is the ``keep_tokens`` that ``analyze`` takes
    (a ``stages.analyze.TokenKeeper``).
    """

    def __init__(self, out: OutputDir, comm: Comm, special_tokens: bool = True):
        self.comm = comm
        self.special_tokens = special_tokens
        self.path = out.ensure() / f".tokens-{comm.rank:05d}.arrow"
        self.rows = 0
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self.parts: list[CachePart] = []
        self._tables: dict[str, pa.Table] = {}
        self.runs: list[tuple[int, int]] | None = None  # (global first row, rows) in the order written

    def count_and_keep(self, table: pa.Table, column: str, tokenizer: Any, where: str) -> np.ndarray:
        """Return the token counts of ``column`` and keep its ids."""
        from ...arrow_types import is_text
        from ...inputs.specs import _column, evaluate, parse_spec

        col = _column(table, column, where)
        if not is_text(col.type):
            return evaluate(parse_spec("tokens", column, "--size"), table, where, tokenizer)  # raises
        ids, counts = token_ids(tokenizer, col, self.special_tokens)
        self._write(pa.record_batch([ids], names=[TOKENS_COLUMN]))
        return counts

    def keep_encoded(self, encoded: Encoded) -> None:
        """Keep the ids and labels of a read of fine-tuning data (prompt/completion texts or chats)."""
        self._write(pa.record_batch([encoded.ids, encoded.labels], names=[TOKENS_COLUMN, LABELS_COLUMN]))

    def _write(self, batch: pa.RecordBatch) -> None:
        try:
            if self._writer is None:
                self._sink = pa.OSFile(str(self.path), "wb")
                self._writer = pa.ipc.new_file(self._sink, batch.schema)
            self._writer.write_batch(batch)
        except (OSError, pa.ArrowException) as exc:
            raise SortpackError(f"{self.path}: cannot write the token cache ({one_line(exc)})") from None
        self.rows += batch.num_rows

    def set_runs(self, runs: list[tuple[int, int]]) -> None:
        """Say which global rows this rank's ids are, as (first row, rows) runs in the order written.

        Without it they are one run after the lower ranks' (one analyze of every input); a
        mixture whose sources were analyzed apart has a run per source.
        """
        self.runs = [(int(a), int(n)) for a, n in runs if n]

    def share(self) -> None:
        """Close this rank's file and learn every rank's parts (path, first row, rows, offset) (collective)."""
        # a second call (a held-out plan is stored first, then the training plan) finds them closed
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        if self.runs is None:
            mine = [CachePart(str(self.path), self.comm.exscan(self.rows), self.rows)]
        else:
            offsets = np.concatenate(([0], np.cumsum([n for _, n in self.runs], dtype=np.int64)))
            mine = [CachePart(str(self.path), a, n, int(o)) for (a, n), o in zip(self.runs, offsets)]
        self.parts = [p for part in self.comm.allgather_obj(mine) for p in part]
        self._tables = {}

    def rows_of(self, start: int, stop: int, column: str = TOKENS_COLUMN) -> pa.Array | pa.ChunkedArray:
        """Return ``column`` (the ids, or the labels) of global rows ``[start, stop)`` as list<int32>, chunked as
        the cache holds them."""
        pieces = []
        for part in self.parts:
            a, b = max(start, part.first), min(stop, part.first + part.rows)
            if a >= b:
                continue
            table = self._tables.get(part.path)
            if table is None:
                table = self._tables[part.path] = pa.ipc.open_file(pa.memory_map(part.path, "r")).read_all()
            pieces.append(table.column(column).slice(part.offset + a - part.first, b - a))
        if not pieces:
            return pa.array([], pa.list_(pa.int32()))
        # not combined: a unit's ids may hold more values than 32-bit offsets address
        return pa.chunked_array([c for p in pieces for c in p.chunks], pa.list_(pa.int32()))

    def remove(self) -> None:
        """Delete this rank's file (after every rank has read what it needs)."""
        self._tables = {}
        Path(self.path).unlink(missing_ok=True)
