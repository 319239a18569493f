"""The labels of a plan's samples read back from its input files and encoded again (``pack`` cutting fine-tuning
samples it no longer holds in memory)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ...errors import SortpackError
from .base import FineTuneShape


def read_labels(shape: FineTuneShape, files: list[dict], ids: np.ndarray, sizes: np.ndarray) -> pa.Array:
    """Return the labels (list<int32>, one row per id) of the samples ``ids``, read back from the plan's input
    ``files`` and encoded again with ``shape`` (loaded).

    Only the input units that hold one of ``ids`` are read. Raises one line where a sample no
    longer measures its recorded ``sizes`` (the input changed since analyze: the tokenizer and
    the chat template were checked against the plan's digests when they were loaded).
    """
    from ..pieces import read_sample_rows

    ids = np.asarray(ids, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    at, parts = [], []
    for pos, table, path in read_sample_rows(files, ids, shape.columns(), shape.text_columns() or None):
        enc = shape.encode(table, path)
        bad = np.flatnonzero(np.asarray(enc.sizes, dtype=np.int64) != sizes[pos])
        if len(bad):
            i = int(bad[0])
            raise SortpackError(f"{path}: sample {int(ids[pos[i]])} has {int(enc.sizes[i])} tokens, the plan was "
                                f"measured at {int(sizes[pos[i]])} (the input changed since analyze)")
        at.append(pos)
        parts.append(enc.labels)
    if not parts:
        return pa.array([], pa.list_(pa.int32()))
    labels = pa.concat_arrays([p.cast(pa.list_(pa.int32())) for p in parts])
    return labels.take(pa.array(np.argsort(np.concatenate(at), kind="stable")))
