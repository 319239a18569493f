"""Indexes for the reader tests: built by the real pipeline, plus a hand-written writer for edge cases.

``pipeline_index`` writes small parquet (``support.write_text_parquet``) and runs
``sortpack.pipeline.dataset.run_all`` in process on the one-rank communicator, in any packing mode;
every reader, torch and dataset test uses it but one. ``write_index`` writes an index by hand
only for a very large index (see its docstring).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sortpack.format import FORMATS, VERSION, index_schema
from sortpack.format import rows_per_shard as format_rows_per_shard
from sortpack.format.schemas import schema_json
from sortpack.parallel import SerialComm
from sortpack.partition import shard_starts
from sortpack.write.output import OutputDir
from sortpack.write.shards import OwnedRows, write_owned_shards

from support import write_text_parquet


def pipeline_index(path, lengths=None, *, inputs=None, stages: int = 1, rows_per_shard: int | None = None,
                   **pack) -> Path:
    """Run the real pipeline (analyze, sort, pack) in process over ``inputs``; return the index path.

    Without ``inputs``, one parquet file of texts with the given ``lengths`` is written beside
    the index (sample id i has size ``lengths[i]``: ``--column text``, the default size);
    ``stages`` is the sort's curriculum stages. ``pack`` holds ``PackOptions`` fields
    (``max_tokens``, ``budget``, ``shapes``, ``same_shape``, ``rows``, ...); ``rows_per_shard``
    cuts the index into small shards (the format's shard size, set for this call only).
    Under ``wide_ids()`` the sample ids are written as int64.
    """
    from sortpack.pipeline.dataset import JobInfo, run_all
    from sortpack.stages.analyze import AnalyzeOptions
    from sortpack.stages.pack import PackOptions
    from sortpack.stages.sort import SortOptions

    path = Path(path)
    if inputs is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        inputs = [str(write_text_parquet(path.parent / f"{path.name}-data.parquet", lengths, row_group_size=97))]
    if "shapes" in pack:
        pack["shapes"] = tuple(pack["shapes"])
    # the shard size is read from the environment when a directory is written
    with _environment(SORTPACK_TEST_SHARD_ROWS=str(rows_per_shard) if rows_per_shard else None):
        run_all(SerialComm(), [str(i) for i in inputs], str(path), AnalyzeOptions(column="text"),
                SortOptions(stages=stages), PackOptions(**pack), overwrite=True, job=JobInfo(argv=["tests"]))
    return path


@contextmanager
def _environment(**overrides: str | None) -> Iterator[None]:
    """Set the environment variables given (None: left as they are) for the block, then restore them."""
    saved = {name: os.environ.get(name) for name in overrides}
    for name, value in overrides.items():
        if value is not None:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def wide_ids() -> AbstractContextManager[None]:
    """Return a block in which indexes store int64 sample ids (the width of indexes over 2^31 input rows)."""
    return _environment(SORTPACK_TEST_ID_BITS="64")


def exact_index(path, m: int, seed: int = 0, per: int = 4, **kw) -> Path:
    """Run the pipeline for an index of exactly ``m`` micro-batches of ``per`` samples; return its path."""
    lengths = np.random.default_rng(seed).integers(1, 200, size=m * per)
    return pipeline_index(path, lengths, max_tokens=200 * per, max_samples=per, **kw)


def _list_array(counts: np.ndarray, values: np.ndarray, value_type) -> pa.Array:
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type))


def write_index(path, counts, sizes=None, *, rows_per_shard: int | None = None) -> Path:
    """Write an index by hand: micro-batch i holds the next ``counts[i]`` sample ids, in order; return its path.

    Kept for the one case the pipeline cannot serve: a very large index in a second (the
    memory-map test opens 200 000 micro-batches; docs/reader.md's performance script writes
    1 000 000), where analyzing and sorting that many rows would take most of the test. Every
    other reader test reads an index the pipeline wrote (``pipeline_index``). ``sizes`` maps a
    sample id to its size (default 1).
    """
    counts = np.asarray(counts, dtype=np.int64)
    m = len(counts)
    total = int(counts.sum())
    ids = np.arange(total, dtype=np.int64)
    sizes = np.ones(total, dtype=np.int64) if sizes is None else np.asarray(sizes, dtype=np.int64)
    starts = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    s = sizes[ids]
    nonempty = counts > 0
    def seg(fn, empty):
        """Return ``fn`` reduced over each micro-batch's sizes (``empty`` for none)."""
        out = np.full(m, empty, dtype=s.dtype)
        if nonempty.any():
            out[nonempty] = fn.reduceat(s, starts[:-1][nonempty])
        return out
    max_size = seg(np.maximum, 0)
    tokens = seg(np.add, 0)
    min_key = seg(np.minimum, 0).astype(np.float64)
    columns = [
        pa.array(np.arange(m, dtype=np.int64)),
        _list_array(counts, ids, pa.int64()),
        pa.array(counts.astype(np.int32)),
        pa.array(counts.astype(np.int32)),
        pa.array(max_size.astype(np.int64)),
        pa.array(max_size.astype(np.int64)),
        pa.array(tokens.astype(np.int64)),
        pa.array(min_key),
        pa.array(max_size.astype(np.float64)),
        pa.array(np.zeros(m, dtype=np.int16)),
    ]
    schema = index_schema()
    table = pa.Table.from_arrays(columns, schema=schema)
    rps = rows_per_shard or format_rows_per_shard("index")
    comm = SerialComm()
    out = OutputDir(comm, path, overwrite=True)
    out.ensure()
    offsets = np.concatenate(([0], np.cumsum(counts)))
    rows_out = OwnedRows(0, m, m, lambda a, b: table.slice(a, b - a), lambda a, b: offsets[b] - offsets[a])
    shards = write_owned_shards(comm, out, "index", rows_out, shard_starts(m, rps))
    manifest = {
        "format": FORMATS["index"], "version": VERSION,
        "num_rows": m, "num_samples": total, "num_microbatches": m, "rows_per_shard": rps,
        "schema": schema_json(schema),
        "options": {"max_tokens": int(max_size.max(initial=0) * counts.max(initial=0)), "budget": "padded"},
        "source": {"num_rows": len(sizes), "files": []},
        "shards": shards, "stats": {}, "provenance": {"created": "test"},
    }
    out.commit(manifest)
    return Path(path)


def write_text_corpus(directory, n: int = 60, seed: int = 0) -> list[dict]:
    """Write ``n`` text rows as two parquet files (several row groups) and one JSONL; return source.files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "eta", "theta"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 12)))) + f" #{i}" for i in range(n)]
    a, b = n // 3, 2 * n // 3
    parts = [
        ("part-0.parquet", texts[:a]),
        ("part-1.parquet", texts[a:b]),
        ("part-2.jsonl", texts[b:]),
    ]
    files = []
    for name, chunk in parts:
        path = directory / name
        if name.endswith(".parquet"):
            pq.write_table(pa.table({"text": chunk, "n": list(range(len(chunk)))}), path, row_group_size=7)
            fmt = "parquet"
        else:
            path.write_text("".join(json.dumps({"text": t, "n": k}) + "\n" for k, t in enumerate(chunk)))
            fmt = "jsonl"
        files.append({"path": os.path.abspath(path), "format": fmt, "rows": len(chunk),
                      "bytes": path.stat().st_size})
    return files


def corpus_texts(files: list[dict]) -> list[str]:
    """Return the texts of a corpus written by ``write_text_corpus``, in sample-id order."""
    out = []
    for f in files:
        if f["format"] == "parquet":
            out.extend(pq.read_table(f["path"], columns=["text"]).column("text").to_pylist())
        else:
            out.extend(json.loads(line)["text"] for line in Path(f["path"]).read_text().splitlines())
    return out


def write_text_index(path, files: list[dict], max_tokens: int = 120, **kw) -> Path:
    """Run the pipeline over a text corpus, sizes = character length of ``text``; return the index path."""
    return pipeline_index(path, inputs=[f["path"] for f in files], max_tokens=max_tokens, **kw)
