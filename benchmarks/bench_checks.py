"""Costs of the trust checks (docs/guarantees.md): python benchmarks/bench_checks.py.

Prints the median of 7 runs of: full validation of 1M rows of text (beside ``--size
length`` on the same column, the work it guards), the per-file input checks, and the
output pre-flight with the stale-temporary sweep.
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sortpack.inputs.discover import check_input_path
from sortpack.inputs.source_file import SourceFile
from sortpack.inputs.text_formats import estimate_rows
from sortpack.inputs.validate import check_table
from sortpack.write.output_guard import check_output, sweep_stale


def median_s(fn, repeat: int = 7) -> float:
    """Return the median wall time of ``repeat`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    """Print the figures of the cost table in docs/guarantees.md."""
    rng = np.random.default_rng(0)
    n = 1_000_000
    lengths = rng.integers(1, 200, n)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", np.uint8)[rng.integers(0, 27, int(lengths.sum()))]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    text = pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(letters.tobytes()))
    table = pa.table({"text": text})
    src = SourceFile("x.arrow", "arrow", 0, [n])
    print(f"1M rows, {letters.nbytes / 1e6:.0f} MB of text")
    print(f"  check_table (full validation): {median_s(lambda: check_table(table, src)) * 1e3:.1f} ms")
    print(f"  utf8_length (--size length):   {median_s(lambda: pc.utf8_length(table.column('text'))) * 1e3:.1f} ms")
    ints = pa.table({"n": pa.array(rng.integers(0, 1000, n))})
    print(f"  check_table, 1M int64:         {median_s(lambda: check_table(ints, src)) * 1e3:.2f} ms")
    d = Path(tempfile.mkdtemp())
    try:
        for i in range(2000):
            (d / f"f{i}.jsonl").write_text('{"text": "hello"}\n' * 3)
        files = sorted(d.iterdir())
        per = median_s(lambda: [check_input_path(str(p)) for p in files], 3) / len(files)
        print(f"check_input_path: {per * 1e6:.1f} us per file")
        per = median_s(lambda: [estimate_rows(str(p), p.stat().st_size) for p in files], 3) / len(files)
        print(f"estimate_rows:    {per * 1e6:.1f} us per file")
        out = d / "plan"
        t = median_s(lambda: (sweep_stale(out), check_output(out, False, [str(files[0])])))
        print(f"check_output + sweep_stale beside 2000 files: {t * 1e3:.2f} ms")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
