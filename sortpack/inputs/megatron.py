"""Megatron-LM's indexed datasets (``PREFIX.idx`` + ``PREFIX.bin``) as an input format, read index-only.

Each sequence of the dataset is a sample of token ids: its length is its size, its index its
sample id (``PREFIX.idx`` names the dataset on the command line, in a directory or a glob, as
``s3://`` or ``gs://`` objects too). The plan holds sample ids only: analyze reads the
``.idx`` (a local ``.bin`` is mapped, its pages never touched to measure), and the reader
gathers each micro-batch's ids from the mapped ``.bin`` (``reader.megatron``). The one column
is ``input_ids`` (a list of the dataset's integer dtype, zero-copy over the mapped ``.bin``).

Fine-tuning labels come from a second dataset of the same layout (one sequence per sequence,
the same lengths, -100 where there is no target), named by ``--labels-column SPEC``: a prefix
relative to each input's directory (or absolute), ``{}`` standing for the input's own prefix
name (``'{}_labels'`` gives ``corpus_labels.idx`` beside ``corpus.idx``). Any column other
than ``input_ids`` a read asks for is such a companion (``megatron_data.companion``).

Like the registry, importing this module loads neither numpy nor pyarrow (``sortpack --help``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .input_format import InputFormat
from .source_file import SourceFile

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

TOKENS = "input_ids"
UNIT_SEQUENCES = 1 << 20  # sequences per unit: what ranks split and a read covers


def holds_token_ids(files: list[SourceFile]) -> bool:
    """Return whether every file is a Megatron dataset, whose samples are token ids: ``--size tokens`` needs no
    tokenizer (a sample's tokens are its sequence's length)."""
    return bool(files) and all(f.format == MegatronFormat.name for f in files)


def _unit_rows(n: int) -> list[int]:
    """Return the sequences of each unit of a dataset of ``n`` sequences."""
    full, rest = divmod(n, UNIT_SEQUENCES)
    return [UNIT_SEQUENCES] * full + ([rest] if rest or not full else [])


def list_array(values: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Return the Arrow list array of ``values`` cut at ``offsets`` (large_list past 2**31 values), zero-copy."""
    import numpy as np
    import pyarrow as pa

    if len(values) < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))


class MegatronFormat(InputFormat):
    """Megatron-LM's ``.idx``/``.bin`` datasets: units of ``UNIT_SEQUENCES`` sequences, one ``input_ids`` column."""

    name = "megatron"
    extensions = (".idx",)
    # the fingerprint hashes the whole .idx (lengths, pointers, documents); the .bin's size is checked
    # against the pointers whenever the dataset is opened
    digest = "file"
    footer_magic = b""

    def open(self, path: str, size: int) -> SourceFile:
        """Return the SourceFile of ``PREFIX.idx``: its index read and checked, its ``.bin`` checked to hold it."""
        import numpy as np

        from .megatron_data import open_data

        data = open_data(path)
        rows = _unit_rows(data.num_sequences)
        ends = np.cumsum([0] + rows)
        tokens = np.concatenate(([0], np.cumsum(data.index.lengths, dtype=np.int64)))
        width = data.index.dtype.itemsize
        return SourceFile(path, self.name, size, rows, [int(tokens[b] - tokens[a]) * width
                                                        for a, b in zip(ends[:-1], ends[1:])])

    def columns(self, src: SourceFile) -> list[str]:
        """Return the one column, ``input_ids``."""
        return [TOKENS]

    def schema(self, src: SourceFile, rows: int) -> pa.Schema:
        """Return the schema a store writes: ``input_ids`` as list<int32> (int64 for an int64 dataset)."""
        import pyarrow as pa

        from .megatron_data import open_data

        wide = open_data(src.path).index.dtype.itemsize == 8
        return pa.schema([pa.field(TOKENS, pa.list_(pa.int64() if wide else pa.int32()))])

    def read(self, src: SourceFile, first: int, last: int, columns: list[str] | None,
             text_columns: list[str] | None) -> pa.Table:
        """Return the sequences of units ``[first, last)`` (``input_ids``, and any companion ``columns`` name)."""
        from .megatron_data import open_data

        lo, hi = first * UNIT_SEQUENCES, min(last * UNIT_SEQUENCES, open_data(src.path).num_sequences)
        return self._table(src, lo, hi, columns)

    def read_rows(self, src: SourceFile, unit: int, rows: range, columns: list[str] | None,
                  text_columns: list[str] | None) -> pa.Table:
        """Return ``rows`` of unit ``unit`` (only those sequences are read)."""
        base = unit * UNIT_SEQUENCES
        return self._table(src, base + rows.start, base + rows.stop, columns)

    def _table(self, src: SourceFile, lo: int, hi: int, columns: list[str] | None) -> pa.Table:
        import pyarrow as pa

        from .megatron_data import companion, open_data

        data = open_data(src.path)
        out = {}
        for name in columns if columns is not None else [TOKENS]:
            source = data if name == TOKENS else companion(data, name)
            out[name] = list_array(*source.tokens(lo, hi))
        return pa.table(out)

    def row_position(self, src: SourceFile, row: int) -> str:
        """Return how a message names row ``row``: its sequence."""
        return f"sequence {row}"
