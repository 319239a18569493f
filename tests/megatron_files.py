"""Megatron ``PREFIX.bin``/``PREFIX.idx`` datasets for the tests, written byte by byte as megatron-core's
``IndexedDatasetBuilder`` writes them (``tests/format/test_megatron_layout.py`` checks they are the same bytes), and
megatron-core's own reader where a test needs it."""
from __future__ import annotations

import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
         np.dtype(np.int64): 5, np.dtype(np.float64): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 8}


def write_dataset(prefix, sequences, dtype=np.uint16, documents=None, modes=None) -> Path:
    """Write ``sequences`` (lists of ints) as ``prefix.bin``/``prefix.idx``; return ``prefix.idx``.

    ``documents``: the document indices (default: one document per sequence, 0..N);
    ``modes``: one int8 per sequence (a multimodal dataset).
    """
    dtype = np.dtype(dtype)
    arrays = [np.asarray(s, dtype=dtype) for s in sequences]
    lengths = np.array([len(a) for a in arrays], dtype=np.int32)
    pointers = np.concatenate(([0], np.cumsum(lengths.astype(np.int64) * dtype.itemsize)[:-1])).astype(np.int64) \
        if len(arrays) else np.zeros(0, np.int64)
    docs = np.arange(len(arrays) + 1, dtype=np.int64) if documents is None else np.asarray(documents, np.int64)
    prefix = str(prefix)
    with open(prefix + ".bin", "wb") as fh:
        for a in arrays:
            fh.write(a.tobytes())
    with open(prefix + ".idx", "wb") as fh:
        fh.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", CODES[dtype]))
        fh.write(struct.pack("<Q", len(arrays)) + struct.pack("<Q", len(docs)))
        fh.write(lengths.tobytes() + pointers.tobytes() + docs.tobytes())
        if modes is not None:
            fh.write(np.asarray(modes, dtype=np.int8).tobytes())
    return Path(prefix + ".idx")


def random_sequences(n: int, seed: int = 0, vocab: int = 50_000, longest: int = 300) -> list[np.ndarray]:
    """Return ``n`` random token sequences of 1 to ``longest`` ids below ``vocab``."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(k)) for k in rng.integers(1, longest + 1, n)]


def labels_for(sequences, seed: int = 1) -> list[np.ndarray]:
    """Return labels of each sequence: -100 over a random prefix (the prompt), the ids after it (the answer)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in sequences:
        lab = np.asarray(s, dtype=np.int64).copy()
        lab[:int(rng.integers(0, len(lab)))] = -100  # at least the last token is a target
        out.append(lab)
    return out


def megatron_core():
    """Return megatron-core's ``indexed_dataset`` module (the test is skipped without it; CPU import is slow)."""
    pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("megatron.core.datasets.indexed_dataset")


def plan_in_process(path, inputs, analyze: dict | None = None, store: tuple[str, ...] = (), **pack) -> Path:
    """Run the real pipeline in process on one rank over ``inputs``; return the plan ``path``.

    ``analyze``: ``AnalyzeOptions`` fields (``size``, ``labels_column``...); ``store``: the
    ``--store`` columns; ``pack``: ``PackOptions`` fields (``max_tokens``, ``rows``, ``oversize``...).
    """
    from sortpack.parallel import SerialComm
    from sortpack.pipeline.dataset import JobInfo, JobOutput, run_all
    from sortpack.stages.analyze import AnalyzeOptions
    from sortpack.stages.pack import PackOptions
    from sortpack.stages.plan_options import PlanOptions
    from sortpack.stages.sort import SortOptions
    from sortpack.write.store import StoreOptions

    analyze = dict(analyze or {})
    if "labels_column" in analyze:  # the fine-tuning shape is an object of its own (sortpack.inputs.finetune)
        from sortpack.inputs.finetune import LabelsShape

        analyze["shape"] = LabelsShape(labels_column=analyze.pop("labels_column"),
                                       column=analyze.get("column") or "input_ids")
    run_all(SerialComm(), [str(i) for i in inputs],
            PlanOptions(AnalyzeOptions(**analyze), SortOptions(), PackOptions(**pack)),
            JobOutput(str(path), JobInfo(argv=["tests"]), overwrite=True,
                      store=StoreOptions(columns=tuple(store)) if store else None))
    return Path(path)
