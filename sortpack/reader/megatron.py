"""A plan over Megatron datasets, read at train time: each micro-batch's ids gathered from the mapped ``.bin``.

The plan holds sample ids only (``inputs.megatron``: sample id = sequence index, datasets in
input order). ``SourceDataset`` hands a micro-batch to ``MegatronRows.samples``, which copies
its sequences out of the mapped ``.bin`` files (one compiled byte gather per dataset, cut to
the pieces of a split plan) into one contiguous ``input_ids`` list column, with the labels
of a fine-tuning plan beside it (``labels``, from the companion dataset its
``--labels-column`` named). The collate helpers read that column as a zero-copy view
(``tokens.list_token_view``): no Python object per token, as from stored data.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import SortpackError
from ..format import read_manifest
from ..format.mapped import guard
from ..inputs.megatron import TOKENS, MegatronFormat, list_array
from ..inputs.megatron_data import MegatronData, companion, gather_many, open_data
from ..inputs.objects import is_url, size_of
from .lazy_rows import TableSamples

LABELS = "labels"  # the key the labels of a fine-tuning plan come under, as stored labels do


class MegatronRows:
    """The Megatron datasets of a plan's input files, read a micro-batch at a time.

    ``files`` are the plan's ``source.files`` entries (every one a Megatron dataset);
    ``labels`` the ``--labels-column`` SPEC of a fine-tuning plan (None: no labels);
    ``columns`` what the dataset was asked for (``input_ids`` and ``labels`` at most).
    Datasets are opened (and checked) on first use in each process.
    """

    def __init__(self, files: list[dict], labels: str | None, columns: list[str] | None):
        self.paths = [str(f["path"]) for f in files]
        self.sizes = [int(f["bytes"]) if "bytes" in f else None for f in files]
        rows = np.array([int(f["rows"]) for f in files], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(rows)))
        self.labels = labels
        self.columns = [c for c in (TOKENS, LABELS) if (columns is None or c in columns)
                        and (c == TOKENS or labels is not None)]
        self._opened: dict[int, tuple[MegatronData, MegatronData | None]] = {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_opened"] = {}  # mapped files stay with the process that mapped them
        return state

    def _data(self, k: int) -> tuple[MegatronData, MegatronData | None]:
        got = self._opened.get(k)
        if got is None:
            data = open_data(self.paths[k])
            rows, size = int(self.starts[k + 1] - self.starts[k]), self.sizes[k]
            if data.num_sequences != rows or (size is not None and size_of(data.path) != size):
                raise SortpackError(f"{data.path}: {data.num_sequences} sequences in {size_of(data.path)} bytes, "
                                    f"the plan was built from {rows} in {size} (the dataset changed)")
            if not data.url:  # a .bin that shrinks under its mapping is one line, not a bus error
                guard(data.bin_path)
            got = (data, companion(data, self.labels) if self.labels is not None else None)
            self._opened[k] = got
        return got

    def gather(self, ids: np.ndarray, ranges: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Return (token ids, labels or None, offsets) of sample ids ``ids`` in order, each cut to its range.

        Ids and labels come widened to int32 (int64 for an int64 dataset): what the collate
        kernels read.
        """
        ids = np.asarray(ids, dtype=np.int64)
        files = np.searchsorted(self.starts, ids, side="right") - 1
        pairs = {k: self._data(k) for k in np.unique(files).tolist()}
        values, labels, offsets = gather_many(pairs, self.starts, ids, ranges)
        return _wide(values), None if labels is None else _wide(labels), offsets

    def samples(self, ids, microbatch, ranges, transform) -> TableSamples:
        """Return the ``TableSamples`` of sample ids ``ids`` (``microbatch``: the ``MicroBatch`` or None)."""
        values, labels, offsets = self.gather(np.asarray(list(ids), dtype=np.int64), ranges)
        cols = {TOKENS: list_array(values, offsets)}
        if labels is not None:
            cols[LABELS] = list_array(labels, offsets)
        table = pa.table({c: cols[c] for c in self.columns})
        return TableSamples(table, microbatch, transform, np.asarray(list(ids), dtype=np.int64))


def _wide(values: np.ndarray) -> np.ndarray:
    """Return ``values`` as int32 (int64 kept): the widths the collate kernels read."""
    return values if values.dtype in (np.int32, np.int64) else values.astype(np.int32)


def megatron_rows(source, files: list[dict], columns: list[str] | None) -> MegatronRows | None:
    """Return the ``MegatronRows`` of a plan whose every input file is a Megatron dataset, else None.

    None too when ``columns`` asks for anything but ``input_ids`` and ``labels``. ``source`` is
    what ``SourceDataset`` was given: a plan (its manifest says the labels SPEC) or input paths.
    """
    if not files or any(f.get("format") != MegatronFormat.name for f in files):
        return None
    if columns is not None and not set(columns) <= {TOKENS, LABELS}:
        return None
    for f in files:
        path = str(f["path"])
        if not is_url(path) and not os.path.isfile(path):
            raise SortpackError(f"{path}: input file of the index is missing")
    return MegatronRows(files, _labels_spec(source), columns)


def _labels_spec(source) -> str | None:
    """Return the ``--labels-column`` SPEC a plan was measured with (None: not a fine-tuning plan, or no plan)."""
    manifest = getattr(source, "manifest", None)
    if manifest is None and isinstance(source, (str, os.PathLike)) and (Path(source) / "manifest.json").is_file():
        manifest = read_manifest(source)
    fine_tune = ((manifest or {}).get("options") or {}).get("fine_tune") or {}
    return fine_tune.get("labels_column") if fine_tune.get("shape") == "labels" else None
