"""A plan's files changing under a running reader: an error naming the file, never a hang or a bare bus error.

Each case runs in a subprocess (a bus error kills the process that takes it; a lost DataLoader
result waits for ever), under a timeout. The plans are written by the real pipeline.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.format.mapped import available

from support import ROOT, make_tokenizer, run_sortpack

pytest.importorskip("torch")

CAUGHT = 3  # the scripts' exit status when the reader raised SortpackError
BUS = 135  # 128 + SIGBUS: the guard's exit status
# the one-line bus error needs the compiled handler (built by `setup.py build_ext`; Linux)
needs_guard = pytest.mark.skipif(not available(), reason="sortpack.format._busguard is not built")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """A --store-tokens plan of 400 texts in data shards of 70 rows and index shards of 8 micro-batches."""
    base = tmp_path_factory.mktemp("changed")
    rng = np.random.default_rng(5)
    words = np.array(["hello", "world", "the", "quick", "brown", "fox"])
    texts = [" ".join(words[rng.integers(0, len(words), rng.integers(1, 60))]) for _ in range(400)]
    pq.write_table(pa.table({"text": texts}), base / "d.parquet", row_group_size=100)
    tok = make_tokenizer(base / "tok.json")
    out = base / "plan"
    run_sortpack(["run", base / "d.parquet", "-o", out, "--column", "text", "--size", "tokens", "--tokenizer", tok,
                  "--max-tokens", "300", "--store-tokens", "--quiet"],
                 env={"SORTPACK_TEST_DATA_ROWS": "70", "SORTPACK_TEST_SHARD_ROWS": "8"})
    return out


def _copy(plan, tmp_path):
    import shutil

    dest = tmp_path / "plan"
    shutil.copytree(plan, dest)
    return dest


def _run(script: str, plan, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``script`` (PLAN bound to the plan's path; SortpackError exits CAUGHT, printing its message)."""
    code = textwrap.dedent("""
        import os, sys, time
        from sortpack.errors import SortpackError
        PLAN = sys.argv[1]
        def data_shard(ds, i):
            # the data shard that holds micro-batch i's rows
            row = int(ds.stored.row_start[i])
            entry = [e for e in ds.index.manifest["data"]["shards"] if e["first"] <= row][-1]
            return os.path.join(PLAN, entry["file"])
        def index_shard(i):
            import json
            entries = json.load(open(os.path.join(PLAN, "manifest.json")))["shards"]
            return os.path.join(PLAN, [e for e in entries if e["first"] <= i][-1]["file"])
        try:
    """) + textwrap.indent(textwrap.dedent(script), "    ") + textwrap.dedent(f"""
        except SortpackError as exc:
            print("SortpackError:", exc)
            sys.exit({CAUGHT})
        print("no error")
    """)
    return subprocess.run([sys.executable, "-c", code, str(plan)], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT),
                          env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"})


def _caught(proc, name: str) -> str:
    assert proc.returncode == CAUGHT, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    line = proc.stdout.strip().splitlines()[-1]
    assert name in line, line
    return line


# --- a DataLoader worker whose rows cannot be built ------------------------------------------------
WORKERS = """
from torch.utils.data import DataLoader
from sortpack.reader import SourceDataset
from sortpack.torch import PackedBatchSampler
{setup}
loader = DataLoader(ds, batch_sampler=PackedBatchSampler(PLAN, rank=0, world_size=1), num_workers=2,
                    collate_fn=lambda x: x)
for batch in loader:
    rows = list(batch)
"""


@pytest.mark.slow
def test_a_shard_truncated_under_dataloader_workers_is_an_error_in_the_loop_not_a_hang(plan, tmp_path):
    plan = _copy(plan, tmp_path)
    setup = """
ds = SourceDataset(PLAN)
for e in ds.index.manifest["data"]["shards"]:  # every data shard changes after the dataset was built
    path = os.path.join(PLAN, e["file"])
    os.truncate(path, os.path.getsize(path) - 10)
"""
    line = _caught(_run(WORKERS.format(setup=setup), plan, timeout=60), "data-0000")
    assert "the manifest says" in line or "when the reader" in line, line


@pytest.mark.slow
def test_a_transform_that_fails_under_dataloader_workers_raises_in_the_loop_not_a_hang(plan, tmp_path):
    setup = """
def fails(row):
    raise KeyError("a transform that fails on a row")
ds = SourceDataset(PLAN, transform=fails)
try:
    for batch in DataLoader(ds, batch_sampler=PackedBatchSampler(PLAN, rank=0, world_size=1), num_workers=2,
                            collate_fn=lambda x: x):
        pass
except KeyError as exc:
    raise SortpackError(f"KeyError in the loop: {exc}") from None
"""
    proc = _run(WORKERS.format(setup=setup), plan, timeout=60)
    _caught(proc, "a transform that fails on a row")


# --- a shard truncated while its mapped memory is in use -------------------------------------------
LOADER = """
from sortpack.reader import PackedIndex, PackedSampler, SourceDataset
from sortpack.reader.loader import PlanLoader
from sortpack.torch import pad_collate
index = PackedIndex(PLAN, verify="{verify}")
ds = SourceDataset(index)
sampler = PackedSampler(index, rank=0, world_size=1)
loader = PlanLoader(ds, sampler, pad_collate(key="input_ids"), prefetch=1)
first = next(iter(loader))  # every shard of micro-batch 0 is mapped now
os.truncate({target}, 0)
time.sleep(0.01)  # a read within 1 ms of the shard's last check is not checked again (the guard's case)
for epoch in range(2):
    loader.set_epoch(epoch)
    for batch in loader:
        pass
"""

ITEMS = """
from sortpack.reader import PackedIndex, PackedSampler, SourceDataset
index = PackedIndex(PLAN, verify="{verify}")
ds = SourceDataset(index)
mb = next(iter(PackedSampler(index, rank=0, world_size=1)))
ds.__getitems__(mb).table.to_pylist()  # its shards are mapped now
os.truncate({target}, 0)
time.sleep(0.01)
ds.__getitems__(mb).table.to_pylist()
"""


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["index", "structure"])
@pytest.mark.parametrize("reader", ["loader", "items"])
@pytest.mark.parametrize("shard", ["data", "index"])
def test_a_mapped_shard_truncated_under_the_reader_is_an_error_naming_it(plan, tmp_path, reader, shard, verify):
    plan = _copy(plan, tmp_path)
    target = "data_shard(ds, 0)" if shard == "data" else "index_shard(0)"
    script = (LOADER if reader == "loader" else ITEMS).format(target=target, verify=verify)
    name = "data-00000.arrow" if shard == "data" else "microbatches-00000.arrow"
    line = _caught(_run(script, plan), name)
    assert "0 bytes" in line and "truncated or rewritten in place" in line, line


def test_a_plan_rewritten_under_the_reader_is_refused_before_its_new_shards_are_mixed_in(plan, tmp_path):
    """A plan replaced whole (a new run with --overwrite) is not read as a mix of the two plans."""
    plan = _copy(plan, tmp_path)
    script = """
import shutil
from sortpack.reader import PackedIndex
ix = PackedIndex(PLAN)
ix.record(0)  # shard 0 mapped
shutil.copytree(PLAN, PLAN + ".new")
shutil.rmtree(PLAN)
os.rename(PLAN + ".new", PLAN)  # the plan is another directory now (as --overwrite leaves it)
ix.record(ix.num_microbatches - 1)  # a shard not mapped yet
"""
    line = _caught(_run(script, plan), "manifest.json")
    assert "replaced by another file" in line, line


@needs_guard
@pytest.mark.parametrize("shard", ["data", "index"])
def test_a_truncation_between_the_check_and_the_read_is_one_line_and_exit_135(plan, tmp_path, shard):
    """What no check can see (the file shrinks while its mapped memory is read) ends the process with one line."""
    plan = _copy(plan, tmp_path)
    if shard == "data":
        script = """
from sortpack.reader import SourceDataset
ds = SourceDataset(PLAN)
view = ds.stored.token_view("input_ids", 0)  # checked: the memory is read after the truncation
os.truncate(data_shard(ds, 0), 0)
print(int(view.values.sum()))
"""
    else:
        script = """
from sortpack.reader import PackedIndex
ix = PackedIndex(PLAN)
view = ix.stored_ids(0)
os.truncate(index_shard(0), 0)
print(int(view.sum()))
"""
    proc = _run(script, plan)
    assert proc.returncode == BUS, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    name = "data-00000.arrow" if shard == "data" else "microbatches-00000.arrow"
    assert len(lines) == 1 and lines[0].startswith("sortpack: ") and name in lines[0], proc.stderr
    assert "bus error" in lines[0] and "exiting with status 135" in lines[0]


@pytest.mark.slow
@needs_guard
def test_a_bus_error_in_a_dataloader_worker_names_the_shard(plan, tmp_path):
    """torch's workers install their own SIGBUS handler; the guard goes in over it at the worker's first read."""
    plan = _copy(plan, tmp_path)
    script = """
import torch
from torch.utils.data import DataLoader
from sortpack.reader import SourceDataset
from sortpack.torch import PackedBatchSampler
ds = SourceDataset(PLAN)
target = data_shard(ds, 0)

def collate(items):
    view = items.token_view("input_ids")
    os.truncate(target, 0)  # after the fetch's check, before the collate reads the memory
    return int(view.values.sum())

sampler = PackedBatchSampler(PLAN, rank=0, world_size=1)
try:
    for batch in DataLoader(ds, batch_sampler=sampler, num_workers=1, collate_fn=collate):
        pass
except RuntimeError as exc:
    print("RuntimeError:", " ".join(str(exc).split()))
    sys.exit(4)
"""
    proc = _run(script, plan, timeout=90)
    assert proc.returncode == 4, (proc.returncode, proc.stdout, proc.stderr)
    assert "exited unexpectedly" in proc.stdout or "killed by signal" in proc.stdout, proc.stdout
    ours = [line for line in proc.stderr.splitlines() if line.startswith("sortpack: ")]
    assert len(ours) == 1 and "data-00000.arrow: bus error" in ours[0], proc.stderr


@pytest.mark.slow
def test_the_unchanged_plan_reads_as_before(plan):
    """The checks raise nothing on a plan nobody touches (both readers, every micro-batch)."""
    proc = _run(LOADER.replace("os.truncate({target}, 0)", "").format(verify="index") + ITEMS.replace(
        "os.truncate({target}, 0)", "").format(verify="index"), plan)
    assert proc.returncode == 0 and "no error" in proc.stdout, proc.stderr
    assert json.loads((plan / "manifest.json").read_text())["num_microbatches"] > 8


@needs_guard
def test_an_arrow_input_truncated_under_source_dataset_is_one_line_and_exit_135(tmp_path):
    """Input files are memory-mapped too (Arrow IPC): one that shrinks while its rows are read names itself."""
    path = tmp_path / "in.arrow"
    table = pa.table({"text": ["x" * (i % 50 + 1) for i in range(20000)]})
    with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    script = """
from sortpack.reader import SourceDataset
ds = SourceDataset([PLAN])
unit = ds.read_unit(0, 19)  # the last record batch, zero-copy from the mapped file
os.truncate(PLAN, 0)
print(unit.to_pylist()[:1])
"""
    proc = _run(script, path)
    assert proc.returncode == BUS, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sortpack: {path.resolve()}: bus error"), proc.stderr
