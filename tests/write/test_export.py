"""``sortpack export``: a plan as Megatron .bin/.idx (read back by megatron-core) and as packed Parquet rows
(read back with Megatron-Bridge's reader logic): sortpack.write.export."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.errors import SortpackError
from sortpack.format.megatron import read_index
from sortpack.parallel import SerialComm
from sortpack.reader import PackedIndex
from sortpack.write.export import ExportRequest, export_plan
from sortpack.write.export.packed_parquet import loss_mask

from megatron_files import labels_for, megatron_core, plan_in_process, random_sequences, write_dataset
from support import MPIEXEC, run_sortpack

SEQS = random_sequences(400, seed=21, vocab=70_000)
LABELS = labels_for(SEQS)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Plans over a Megatron dataset (with labels) and over the same ids stored from Parquet."""
    root = tmp_path_factory.mktemp("export")
    idx = write_dataset(root / "corpus", SEQS, np.int32)
    write_dataset(root / "corpus_labels", LABELS, np.int32)
    pq.write_table(pa.table({"input_ids": [s.tolist() for s in SEQS], "labels": [s.tolist() for s in LABELS]}),
                   root / "sft.parquet")
    return root, {
        "megatron": plan_in_process(root / "mg", [idx], max_tokens=700),
        "rows": plan_in_process(root / "rows", [idx], {"labels_column": "{}_labels"}, max_tokens=600, rows=600,
                                oversize="split"),
        "stored": plan_in_process(root / "stored", [root / "sft.parquet"], {"labels_column": "labels"},
                                  ("input_ids", "labels"), max_tokens=600, rows=600),
        "text": plan_in_process(root / "text", [_text(root)], {"column": "text"}, max_tokens=64),
    }


def _text(root: Path) -> Path:
    pq.write_table(pa.table({"text": ["abc", "defgh", "i"]}), root / "text.parquet")
    return root / "text.parquet"


def _planned(plan: Path) -> list[tuple[int, int, int]]:
    """Return (sample id, begin, end) of every planned sample in plan order (whole samples: end None)."""
    index = PackedIndex(plan)
    out = []
    for i in range(index.num_microbatches):
        ids = index.microbatch(i).tolist()
        ranges = index.piece_ranges(i) or ([0] * len(ids), [None] * len(ids))
        out += [(s, int(b), None if e is None else int(e)) for s, b, e in zip(ids, *ranges)]
    return out


def _read(prefix: Path) -> tuple[list[list[int]], np.ndarray, np.dtype]:
    """Return the sequences, document indices and dtype of a Megatron dataset, read with sortpack's layout reader."""
    index = read_index(Path(f"{prefix}.idx").read_bytes(), "x")
    data = np.frombuffer(Path(f"{prefix}.bin").read_bytes(), dtype=index.dtype)
    size = index.dtype.itemsize
    seqs = [data[p // size:p // size + n].tolist() for p, n in zip(index.pointers.tolist(), index.lengths.tolist())]
    return seqs, index.documents, index.dtype


@pytest.mark.parametrize("name, source", [("megatron", SEQS), ("rows", SEQS), ("stored", SEQS)])
def test_one_sequence_per_planned_sample_in_plan_order(plans, tmp_path, name, source):
    _, p = plans
    summary = export_plan(SerialComm(), ExportRequest(str(p[name]), "megatron", str(tmp_path / "out")))
    seqs, docs, dtype = _read(tmp_path / "out")
    assert seqs == [source[s][b:e].tolist() for s, b, e in _planned(p[name])]
    index = PackedIndex(p[name])
    assert docs.tolist() == [0, *np.cumsum(index["num_samples"]).tolist()]  # a document per micro-batch
    assert dtype == np.int32  # ids up to 70,000 do not fit uint16
    assert summary["sequences"] == len(seqs) and summary["documents"] == index.num_microbatches


def test_labels_go_to_a_second_prefix(plans, tmp_path):
    _, p = plans
    summary = export_plan(SerialComm(), ExportRequest(str(p["rows"]), "megatron", str(tmp_path / "sft")))
    assert summary["files"] == [str(tmp_path / n) for n in ("sft_labels.bin", "sft_labels.idx", "sft.bin", "sft.idx")]
    labels, docs, dtype = _read(tmp_path / "sft_labels")
    assert labels == [LABELS[s][b:e].tolist() for s, b, e in _planned(p["rows"])]
    assert dtype == np.int32 and docs.tolist() == _read(tmp_path / "sft")[1].tolist()


def test_the_smallest_dtype_holds_the_vocabulary(tmp_path):
    small = random_sequences(50, seed=3, vocab=1000)
    plan = plan_in_process(tmp_path / "p", [write_dataset(tmp_path / "d", small, np.int64)], max_tokens=400)
    export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "a")))
    assert _read(tmp_path / "a")[2] == np.uint16  # int64 source, ids below 1000: Megatron's uint16
    export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "b"), False, 100_000))
    assert _read(tmp_path / "b")[2] == np.int32 and _read(tmp_path / "b")[0] == _read(tmp_path / "a")[0]
    top = max(int(x.max()) for x in small)  # the plan's highest id, whichever micro-batch holds it
    with pytest.raises(SortpackError, match=rf"--vocab-size 500: the plan holds the token id {top} \(ids must lie"):
        export_plan(SerialComm(), ExportRequest(str(plan), "megatron", str(tmp_path / "c"), False, 500))
    assert not any(n.startswith(("c.", ".c.")) for n in os.listdir(tmp_path))


def test_chunks_shared_by_the_workers_write_the_same_bytes(plans, tmp_path, monkeypatch):
    _, p = plans
    export_plan(SerialComm(), ExportRequest(str(p["rows"]), "megatron", str(tmp_path / "one")))
    monkeypatch.setenv("SORTPACK_TEST_EXPORT_TOKENS", "97")  # dozens of chunks, taken by whichever worker is free
    export_plan(SerialComm(), ExportRequest(str(p["rows"]), "megatron", str(tmp_path / "many")))
    for name in ("one.bin", "one.idx", "one_labels.bin", "one_labels.idx"):
        assert (tmp_path / name).read_bytes() == (tmp_path / name.replace("one", "many")).read_bytes()


def test_a_write_failing_in_any_worker_is_one_line_and_writes_nothing(plans, tmp_path, monkeypatch):
    import threading

    from sortpack.write.export import chunk_writer

    _, p = plans
    monkeypatch.setenv("SORTPACK_TEST_EXPORT_TOKENS", "97")
    real, calls = chunk_writer.write_runs, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 9:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(chunk_writer, "write_runs", failing)
    with pytest.raises(SortpackError, match=r"out.bin: cannot write the export \(No space left on device\)"):
        export_plan(SerialComm(), ExportRequest(str(p["megatron"]), "megatron", str(tmp_path / "out")))
    assert os.listdir(tmp_path) == []
    assert not [t for t in threading.enumerate() if t.name == "sortpack-export"]  # both stopped


def test_an_interrupt_while_the_other_worker_writes_waits_for_it(plans, tmp_path, monkeypatch):
    import _thread
    import signal
    import threading
    import time

    from sortpack.write.export import chunk_writer

    _, p = plans
    real, writing, helper_in = chunk_writer.write_runs, [], threading.Event()

    def slow_in_the_helper(*args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            helper_in.wait(10)  # the helper takes a chunk first, and the Ctrl-C comes while it writes
        elif not writing:
            writing.append(1)
            _thread.interrupt_main()
            helper_in.set()
            time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(chunk_writer, "write_runs", slow_in_the_helper)
    monkeypatch.setenv("SORTPACK_TEST_EXPORT_TOKENS", "97")
    # Python's own Ctrl-C, a KeyboardInterrupt, as in library use: a test earlier in this process that ran the CLI
    # in process installed sortpack's handler and its wakeup fd, whose watcher ends the process on a SIGINT (it
    # ended pytest, with no summary, in CI's full run)
    previous, wakeup = signal.signal(signal.SIGINT, signal.default_int_handler), signal.set_wakeup_fd(-1)
    try:
        with pytest.raises(KeyboardInterrupt):
            export_plan(SerialComm(), ExportRequest(str(p["megatron"]), "megatron", str(tmp_path / "out")))
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.set_wakeup_fd(wakeup, warn_on_full_buffer=False)
    assert writing and not [t for t in threading.enumerate() if t.name == "sortpack-export"]
    assert os.listdir(tmp_path) == []


def test_refusals_write_nothing(plans, tmp_path):
    root, p = plans
    with pytest.raises(SortpackError, match="stores no token ids and its inputs are not Megatron datasets"):
        export_plan(SerialComm(), ExportRequest(str(p["text"]), "megatron", str(tmp_path / "t")))
    with pytest.raises(SortpackError, match="not a --rows plan"):
        export_plan(SerialComm(), ExportRequest(str(p["megatron"]), "packed-parquet", str(tmp_path / "t.parquet")))
    with pytest.raises(SortpackError, match="inside the plan"):
        export_plan(SerialComm(), ExportRequest(str(p["megatron"]), "megatron", str(p["megatron"] / "x")))
    for output in ("", str(tmp_path / "sub") + "/", str(tmp_path / ".."), "."):
        with pytest.raises(SortpackError, match="names no file to write"):
            export_plan(SerialComm(), ExportRequest(str(p["megatron"]), "megatron", output))
    (tmp_path / "mine.bin").write_bytes(b"a user's file")
    with pytest.raises(SortpackError, match=r"mine.bin: output exists \(use --overwrite"):
        export_plan(SerialComm(), ExportRequest(str(p["megatron"]), "megatron", str(tmp_path / "mine")))
    with pytest.raises(SortpackError, match="not part of a Megatron dataset"):
        export_plan(SerialComm(), ExportRequest(str(p["megatron"]), "megatron", str(tmp_path / "mine"), True))
    assert (tmp_path / "mine.bin").read_bytes() == b"a user's file"
    assert sorted(os.listdir(tmp_path)) == ["mine.bin"]


def test_overwrite_replaces_an_export(plans, tmp_path):
    _, p = plans
    export_plan(SerialComm(), ExportRequest(str(p["megatron"]), "megatron", str(tmp_path / "o")))
    first = (tmp_path / "o.bin").read_bytes()
    # -o PREFIX.idx names the prefix too
    export_plan(SerialComm(), ExportRequest(str(p["rows"]), "megatron", str(tmp_path / "o.idx"), True))
    assert (tmp_path / "o.bin").read_bytes() != first and (tmp_path / "o_labels.idx").exists()
    export_plan(SerialComm(), ExportRequest(str(p["rows"]), "packed-parquet", str(tmp_path / "r.idx.parquet")))
    export_plan(SerialComm(), ExportRequest(str(p["rows"]), "packed-parquet", str(tmp_path / "r.idx.parquet"), True))
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(SortpackError, match="a Parquet file sortpack did not write"):
        export_plan(SerialComm(), ExportRequest(str(p["rows"]), "packed-parquet", str(tmp_path / "other.parquet"),
                                                True))


def test_loss_mask_marks_the_next_tokens_target():
    labels = np.array([-100, -100, 7, 8, -100, 3, -100, 5])  # documents [0, 4) [4, 5) [5, 8)
    offsets = np.array([0, 4, 5, 8])
    assert loss_mask(labels, offsets).tolist() == [0, 1, 1, 0, 0, 0, 1, 0]
    assert loss_mask(None, offsets).tolist() == [1, 1, 1, 0, 0, 1, 1, 0]


# --- Megatron-Bridge's packed Parquet reader, re-implemented from its source ------------------------------
# megatron/bridge/data/packing/parquet.py (GPTSFTPackedParquetDataset.__getitem__: one row group read, the row's
# columns as Python lists, seq_boundaries = seq_start_id + [len(input_ids)]) and the collate of its parent
# GPTSFTPackedDataset (megatron/bridge/data/packing/gpt_sft.py: per document, the inputs ids[b:e-1], the labels
# ids[b+1:e], the loss mask loss_mask[b:e-1] with answer_only_loss). Checked at Megatron-Bridge 0.7.0
# (NVIDIA-NeMo/Megatron-Bridge 067f987d); NeMo 2.6's GPTSFTPackedDataset (nemo/collections/llm/gpt/data/core.py)
# reads the same keys from .npy.


def _bridge_rows(path: Path) -> list[dict]:
    """Return every row as Bridge's ``GPTSFTPackedParquetDataset.__getitem__`` does, row group by row group."""
    pf = pq.ParquetFile(str(path))
    assert {"input_ids", "seq_start_id", "loss_mask"} <= set(pf.schema_arrow.names)  # its REQUIRED_COLUMNS
    out = []
    for g in range(pf.metadata.num_row_groups):
        table = pf.read_row_group(g, columns=["input_ids", "seq_start_id", "loss_mask"])
        for r in range(table.num_rows):
            ids = table.column("input_ids")[r].as_py()
            out.append({"input_ids": ids, "seq_boundaries": table.column("seq_start_id")[r].as_py() + [len(ids)],
                        "loss_mask": table.column("loss_mask")[r].as_py()})
    return out


def _bridge_targets(item: dict) -> list[tuple[int, int]]:
    """Return the (label token, loss weight) pairs Bridge's collate trains one packed row with."""
    bounds, ids, mask = item["seq_boundaries"], item["input_ids"], item["loss_mask"]
    pairs = []
    for b, e in zip(bounds[:-1], bounds[1:]):
        pairs += list(zip(ids[b + 1:e], mask[b:e - 1]))
    return pairs


@pytest.mark.parametrize("name", ["rows", "stored"])
def test_packed_parquet_is_what_bridge_reads(plans, tmp_path, name):
    _, p = plans
    out = tmp_path / "train.idx.parquet"
    summary = export_plan(SerialComm(), ExportRequest(str(p[name]), "packed-parquet", str(out)))
    schema = pq.read_schema(out)
    assert schema.remove_metadata() == pa.schema([("input_ids", pa.list_(pa.int64())),
                                                  ("loss_mask", pa.list_(pa.int8())),
                                                  ("seq_start_id", pa.list_(pa.int64()))])
    rows = _bridge_rows(out)
    index = PackedIndex(p[name])
    planned = iter(_planned(p[name]))
    n = 0
    for i in range(index.num_microbatches):
        splits = index.row_splits(i).tolist()
        for a, b in zip(splits[:-1], splits[1:]):
            docs = [next(planned) for _ in range(b - a)]
            item = rows[n]
            n += 1
            assert item["input_ids"] == [t for s, lo, hi in docs for t in SEQS[s][lo:hi].tolist()]
            assert np.diff(item["seq_boundaries"]).tolist() == [len(SEQS[s][lo:hi]) for s, lo, hi in docs]
            # every label Bridge trains is a target of the plan, and every target of the plan is trained
            want = [(int(t), int(lab != -100)) for s, lo, hi in docs
                    for t, lab in zip(SEQS[s][lo:hi][1:], LABELS[s][lo:hi][1:])]
            assert _bridge_targets(item) == want
    assert n == len(rows) == summary["rows"]
    assert [pq.ParquetFile(out).metadata.row_group(g).num_rows for g in range(pq.ParquetFile(out).num_row_groups)] \
        == [min(500, len(rows))]


@pytest.mark.slow
def test_megatron_core_reads_the_export_in_plan_order(plans, tmp_path):
    mc = megatron_core()
    _, p = plans
    export_plan(SerialComm(), ExportRequest(str(p["rows"]), "megatron", str(tmp_path / "sft")))
    ids, labels = mc.IndexedDataset(str(tmp_path / "sft")), mc.IndexedDataset(str(tmp_path / "sft_labels"))
    planned = _planned(p["rows"])
    assert len(ids) == len(labels) == len(planned)
    for k, (s, b, e) in enumerate(planned):
        assert ids[k].tolist() == SEQS[s][b:e].tolist() and labels[k].tolist() == LABELS[s][b:e].tolist()
    index = PackedIndex(p["rows"])
    assert ids.document_indices.tolist() == [0, *np.cumsum(index["num_samples"]).tolist()]
    # a micro-batch is a document: megatron-core's slice of one document's sequences is that micro-batch
    first = int(index["num_samples"][0])
    assert [x.tolist() for x in ids[0:first]] == [SEQS[s][b:e].tolist() for s, b, e in planned[:first]]


@pytest.mark.slow
def test_the_cli_exit_2_one_line(plans, tmp_path):
    _, p = plans
    proc = run_sortpack(["export", p["text"], "--to", "megatron", "-o", tmp_path / "x"], check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "stores no token ids" in proc.stderr
    done = run_sortpack(["export", p["rows"], "--to", "packed-parquet", "-o", tmp_path / "r.idx.parquet"])
    assert done.stdout.startswith(f"wrote {tmp_path / 'r.idx.parquet'}: ") and "packed rows" in done.stdout
    proc = run_sortpack(["export", p["rows"], "--to", "packed-parquet", "-o", tmp_path / "r.idx.parquet"], check=False)
    assert proc.returncode == 2 and "output exists (use --overwrite" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["r.idx.parquet"]


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("name", ["rows", "stored"])
def test_the_export_is_the_same_at_1_to_4_ranks(plans, tmp_path, name):
    if MPIEXEC is None:
        pytest.skip("mpiexec not found")
    _, p = plans
    for k in (1, 2, 3, 4):
        run_sortpack(["export", p[name], "--to", "megatron", "-o", tmp_path / f"r{k}", "--quiet"], ranks=k)
    names = ["_labels.bin", "_labels.idx", ".bin", ".idx"]
    first = {n: (tmp_path / f"r1{n}").read_bytes() for n in names}
    for k in (2, 3, 4):
        assert {n: (tmp_path / f"r{k}{n}").read_bytes() for n in names} == first, k
    run_sortpack(["export", p[name], "--to", "packed-parquet", "-o", tmp_path / "a.parquet", "--quiet"], ranks=3)
    run_sortpack(["export", p[name], "--to", "packed-parquet", "-o", tmp_path / "b.parquet", "--quiet"])
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


@pytest.mark.mpi
@pytest.mark.slow
def test_a_plan_over_several_datasets_exports_the_same_at_1_to_3_ranks(tmp_path):
    # a one-sequence dataset first: at 2-3 ranks a rank's samples all come from the second, whose ids do not
    # start at 0
    if MPIEXEC is None:
        pytest.skip("mpiexec not found")
    first, second = [np.array([7], np.int32)], random_sequences(300, seed=5, vocab=3000)
    inputs = [write_dataset(tmp_path / "one", first, np.int32), write_dataset(tmp_path / "two", second, np.int32)]
    plan = plan_in_process(tmp_path / "plan", inputs, max_tokens=400, oversize="split")
    seqs = first + second
    for k in (1, 2, 3):
        run_sortpack(["export", plan, "--to", "megatron", "-o", tmp_path / f"r{k}", "--quiet"], ranks=k)
    got, _, _ = _read(tmp_path / "r1")
    assert got == [seqs[s][b:e].tolist() for s, b, e in _planned(plan)]
    for k in (2, 3):
        for ext in (".bin", ".idx"):
            assert (tmp_path / f"r{k}{ext}").read_bytes() == (tmp_path / f"r1{ext}").read_bytes(), (k, ext)
    # a --vocab-size too small: the same line at any rank count
    lines = {run_sortpack(["export", plan, "--to", "megatron", "-o", tmp_path / "v", "--vocab-size", "2000"],
                          ranks=k, check=False).stderr for k in (1, 3)}
    assert lines == {f"Error: --vocab-size 2000: the plan holds the token id "
                     f"{max(int(x.max()) for x in seqs)} (ids must lie in [0, 2000))\n"}


def test_the_cli_lists_every_export_format():
    from sortpack.cli.export import _TARGETS
    from sortpack.write.export import TARGETS

    assert _TARGETS == tuple(TARGETS)
