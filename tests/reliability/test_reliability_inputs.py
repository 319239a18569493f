"""Bad inputs and options give one line (exit 2),
never a hang, a segfault or a traceback; reports count what they say they count."""
from __future__ import annotations

import json
import os
import re
import struct
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reliability_support import RUN, debris, error_line, make_inputs, run

pytestmark = pytest.mark.mpi


# --- item 12: a FIFO among the inputs ---------------------------------------------------------

@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.slow
def test_a_fifo_among_the_inputs_is_refused_unopened(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    os.mkfifo(tmp_path / "data" / "x.parquet")  # opening it for reading would block forever
    error_line(run(["run", "data", "-o", "plan", *RUN], tmp_path, ranks, timeout=60), "x.parquet: a FIFO")
    error_line(run(["analyze", "data/x.parquet", "-o", "m", "--column", "text"], tmp_path, timeout=60), "a FIFO")
    error_line(run(["analyze", "data/*.parquet", "-o", "m", "--column", "text"], tmp_path, timeout=60), "a FIFO")
    assert debris(tmp_path, "plan") == [] and not (tmp_path / "plan").exists()


# --- item 14: a file name that is not UTF-8 -------------------------------------------------------

def test_a_file_name_that_is_not_utf8(tmp_path):
    make_inputs(tmp_path / "data")
    os.rename(tmp_path / "data" / "part-1.parquet", os.fsencode(tmp_path / "data") + b"/part-\xff.parquet")
    error_line(run(["run", "data", "-o", "plan", *RUN], tmp_path), "not valid UTF-8")


# --- item 7: invalid UTF-8 in a text column, refused at plan time with file and line ----------------

def _bad_jsonl(path):
    path.write_bytes(b'{"text": "fine"}\n\n{"text": "also fine"}\n{"text": "b\xffd"}\n{"text": "ok"}\n')
    return path


@pytest.mark.parametrize("ranks", [1, 2])
def test_invalid_utf8_in_jsonl_names_the_file_and_line(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    _bad_jsonl(tmp_path / "data" / "z.jsonl")
    line = error_line(run(["run", "data", "-o", "plan", *RUN], tmp_path, ranks))
    assert re.search(r"z\.jsonl: line 4: column 'text' is not valid UTF-8", line), line


def test_invalid_utf8_with_size_tokens_and_in_csv(tmp_path):
    pytest.importorskip("tokenizers")
    from support import make_tokenizer

    tok = make_tokenizer(tmp_path / "tok.json")
    _bad_jsonl(tmp_path / "z.jsonl")
    line = error_line(run(["analyze", "z.jsonl", "-o", "m", "--column", "text", "--size", "tokens",
                           "--tokenizer", tok], tmp_path))
    assert "z.jsonl: line 4" in line, line
    (tmp_path / "z.csv").write_bytes(b"text\nfine\nb\xffd\n")
    assert "z.csv: line 3" in error_line(run(["analyze", "z.csv", "-o", "m", "--column", "text"], tmp_path))


# --- item 16: corrupt Arrow offsets in an input file -----------------------------------------------

def _corrupt_arrow(path):
    texts = ["abc" * (i % 50 + 1) for i in range(2000)]
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, pa.schema([("text", pa.string())])) as w:
        w.write_table(pa.table({"text": texts}))
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack("<iii", 0, 3, 9))  # the start of the offsets buffer
    data[at + 400:at + 404] = struct.pack("<i", 2**30)  # offset of row 100 far out of bounds
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("ranks", [1, 2])
def test_corrupt_arrow_offsets_are_an_error_not_a_segfault(tmp_path, ranks):
    _corrupt_arrow(tmp_path / "c.arrow")
    line = error_line(run(["run", "c.arrow", "-o", "plan", *RUN], tmp_path, ranks))
    assert "c.arrow: corrupt arrow data in column 'text'" in line, line


# --- item 13: a full disk (here: a file size limit) while writing shards --------------------------

LIMITED = """
import resource, signal, sys
from mpi4py import MPI  # noqa: F401 - MPI's own shared-memory files first, then the limit
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (60000, 60000))
sys.argv[0] = "sortpack"
from sortpack.cli import main
main()
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_failed_shard_write_is_one_line_and_leaves_nothing(tmp_path, ranks):
    from support import MPIEXEC, ROOT

    pq.write_table(pa.table({"n": [i % 977 + 1 for i in range(60000)]}), tmp_path / "big.parquet")
    (tmp_path / "limited.py").write_text(LIMITED)
    cmd = [sys.executable, "limited.py", "run", "big.parquet", "-o", "plan", "--size", "column:n",
           "--max-tokens", "3000"]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    import subprocess

    proc = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=90)
    error_line(proc, "plan: cannot write")
    assert debris(tmp_path, "plan") == [] and not (tmp_path / "plan").exists()


# --- item 15: --quadratic-scale and a python: SPEC that calls sys.exit ----------------------------

@pytest.mark.parametrize("q", ["inf", "nan", "0", "-2"])
def test_quadratic_scale_must_be_finite_and_positive(tmp_path, q):
    make_inputs(tmp_path / "data")
    error_line(run(["run", "data", "-o", "plan", *RUN, "--budget", "quadratic", "--quadratic-scale", q], tmp_path),
               "--quadratic-scale")


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_python_spec_calling_sys_exit(tmp_path, ranks):
    make_inputs(tmp_path / "data")
    (tmp_path / "quitter.py").write_text("import sys\n\ndef size(batch):\n    sys.exit(3)\n")
    line = error_line(run(["run", "data", "-o", "plan", "--size", "python:quitter:size", "--max-tokens", "400"],
                          tmp_path, ranks))
    assert "python:quitter:size called sys.exit(3)" in line, line


# --- item 17 and the new user's reports ---------------------------------------------------------------

@pytest.mark.parametrize("ranks", [1, 2])
def test_manifest_sums_do_not_wrap_past_int64(tmp_path, ranks):
    pq.write_table(pa.table({"n": [2**60] * 20}), tmp_path / "huge.parquet")
    proc = run(["run", "huge.parquet", "-o", "plan", "--size", "column:n", "--max-tokens", str(2**62),
                "--keep-intermediate", "--quiet"], tmp_path, ranks)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "plan.metrics" / "manifest.json").read_text())["stats"]["size_sum"] == 20 * 2**60
    stats = json.loads((tmp_path / "plan" / "manifest.json").read_text())["stats"]
    assert stats["tokens"] == stats["padded_tokens"] == 20 * 2**60


def test_jsonl_progress_counts_rows_not_bytes(tmp_path):
    ranks = 2  # the job total is shown beside rank 0's share
    d = tmp_path / "tiny"
    d.mkdir()
    for i in range(300):
        (d / f"f{i:04d}.jsonl").write_text('{"text": "hello world"}\n{"text": "abc"}\n')
    proc = run(["analyze", "tiny", "-o", "m", "--column", "text"], tmp_path, ranks,
               env={"SORTPACK_PROGRESS_DELAY": "0"})
    assert proc.returncode == 0, proc.stderr
    done = [line for line in proc.stderr.splitlines() if "analyze done" in line]
    assert done and "(job 600)" in done[0], proc.stderr  # rows, not 12.6k bytes


def test_jsonl_row_estimate_of_a_large_file():
    import tempfile

    from sortpack.inputs.text_formats import estimate_rows

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as fh:
        for i in range(50000):
            fh.write('{"text": "%s"}\n' % ("x" * (i % 40 + 1)))
    try:
        est = estimate_rows(fh.name, os.path.getsize(fh.name))
        assert 0.8 * 50000 < est < 1.25 * 50000, est
    finally:
        os.unlink(fh.name)


OVERSIZE = {
    "pad": (["--pad-to-multiple", str(2**40)], "padded past --max-tokens 400 by --pad-to-multiple 1099511627776"),
    "quadratic": (["--budget", "quadratic", "--quadratic-scale", "0.001"], "--quadratic-scale 0.001"),
    "shapes": (["--shapes", "8,16"], "longer than the largest of --shapes (16"),
    "budget": (["--max-tokens", "20"], "do not fit --max-tokens 20 alone"),
}


@pytest.mark.parametrize("case", sorted(OVERSIZE))
def test_the_oversize_message_blames_the_option_at_fault(tmp_path, case):
    make_inputs(tmp_path / "data")
    extra, expect = OVERSIZE[case]
    line = error_line(run(["run", "data", "-o", "plan", *RUN, *extra], tmp_path))
    assert expect in line, line
    # the measurements are kept, and the line says how to pack them without measuring again
    assert "kept in plan.metrics" in line and "sortpack sort plan.metrics -o plan.sorted" in line, line


def test_skipped_samples_are_counted_and_an_empty_index_warns(tmp_path):
    make_inputs(tmp_path / "data")
    proc = run(["run", "data", "-o", "plan", "--column", "text", "--max-tokens", "60", "--oversize", "skip"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"--oversize skip dropped \d+ of 800 samples", proc.stderr), proc.stderr
    proc = run(["run", "data", "-o", "none", "--column", "text", "--max-tokens", "1", "--pad-to-multiple", "2",
                "--oversize", "skip", "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning: --oversize skip dropped all 800 samples" in proc.stderr, proc.stderr


def test_profile_table_columns_line_up(tmp_path):
    make_inputs(tmp_path / "data")
    proc = run(["run", "data", "-o", "plan", *RUN, "--profile"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("stage"))):]
    rows = [x for x in table if re.match(r"^\w+\s+\d+\.\d{3}\s+\d+\.\d$", x)]
    assert len(rows) >= 4, proc.stdout
    ends = {len(x) for x in [table[0], *rows]}
    walls = {x.index(".") for x in rows}
    assert len(ends) == 1 and len(walls) == 1, table
