"""Reliability suite, the read side: what sortpack reads, it checks.

Each test is one defect found by trying sortpack as a new user would; every one failed before
the fix. A changed input is refused by ``pack --store``; a corrupted shard stops ``sort`` and
``pack`` before they write; a manifest cannot point outside its directory; a corrupt shard is
an error naming the file (never a segfault, never a duplicate sample); a corrupt resume state
is refused field by field; ``verify`` never hashes a file whose size is already wrong.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sortpack.errors import SortpackError
from sortpack.reader import PackedIndex

from reader_fixtures import pipeline_index
from support import ROOT, run_sortpack, write_text_parquet


# --- helpers --------------------------------------------------------------------------------
def _write_jsonl(path: Path, n: int = 400) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"text": "abcdefghij"[: 1 + i % 10] * (1 + (i * 7) % 30)}) + "\n")
    return path


def _buffer_offset(path: Path, column: str, which: int, child: bool = False) -> int:
    """Return the file offset of buffer ``which`` of ``column`` (of its values with ``child``) in a shard."""
    mm = pa.memory_map(str(path))
    base = mm.read_buffer().address
    mm.seek(0)
    col = pa.ipc.open_file(mm).get_batch(0).column(column)
    if child:
        col = col.values
    return col.buffers()[which].address - base


def _poke(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(data)


def _flip(path: Path, at: int, mask: int = 1) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ mask]))


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _one_error_line(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return lines[0]


@pytest.fixture
def sorted_dir(tmp_path):
    """A JSONL input analyzed and sorted by the CLI: (input, metrics dir, sorted dir)."""
    src = _write_jsonl(tmp_path / "in.jsonl")
    run_sortpack(["analyze", src, "-o", tmp_path / "m", "--column", "text", "--quiet"])
    run_sortpack(["sort", tmp_path / "m", "-o", tmp_path / "s", "--quiet"])
    return src, tmp_path / "m", tmp_path / "s"


# --- item 2: pack --store sees a same-size edit ---------------------------------------------
@pytest.mark.slow
def test_pack_store_refuses_a_same_size_edit_of_an_input(sorted_dir, tmp_path):
    src, _, s = sorted_dir
    original = src.read_bytes()
    stat = src.stat()
    lines = original.decode().splitlines(True)
    lines[3], lines[4] = lines[4], lines[3]  # same size, same rows
    swapped = "".join(lines).encode()
    assert len(swapped) == len(original) and swapped != original
    src.write_bytes(swapped)
    proc = run_sortpack(["pack", s, "-o", tmp_path / "ix", "--max-tokens", 400, "--store", "text", "--quiet"],
                        check=False)
    assert str(src) in _one_error_line(proc)
    assert not (tmp_path / "ix").exists()
    # the same edit with the mtime put back (cp -p, tar, rsync -t): the content digest sees it
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    proc = run_sortpack(["pack", s, "-o", tmp_path / "ix", "--max-tokens", 400, "--store", "text", "--quiet"],
                        check=False)
    assert "content changed" in _one_error_line(proc)
    # the right content with a new mtime (copied without -p): the whole-file digest vouches for it
    src.write_bytes(original)
    run_sortpack(["pack", s, "-o", tmp_path / "ix", "--max-tokens", 400, "--store", "text", "--quiet"])


@pytest.mark.slow
def test_a_touched_parquet_input_is_refused_and_mtimes_stay_out_of_content_hash(tmp_path):
    src = write_text_parquet(tmp_path / "in.parquet", np.arange(1, 300) % 50 + 1, row_group_size=64)
    run_sortpack(["analyze", src, "-o", tmp_path / "m1", "--quiet"])
    m1 = _manifest(tmp_path / "m1")
    entry = m1["source"]["files"][0]
    assert entry["sha256_of"] == "footer" and "mtime_ns" not in entry
    assert m1["provenance"]["source_mtime_ns"] == [src.stat().st_mtime_ns]
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))  # touched: same bytes
    run_sortpack(["analyze", src, "-o", tmp_path / "m2", "--quiet"])
    assert _manifest(tmp_path / "m2")["content_hash"] == m1["content_hash"]  # a plan's identity is its content
    run_sortpack(["sort", tmp_path / "m1", "-o", tmp_path / "s", "--quiet"])
    # the sorted directory carries the mtime analyze recorded; a footer digest cannot vouch for the rows
    assert _manifest(tmp_path / "s")["provenance"]["source_mtime_ns"] == m1["provenance"]["source_mtime_ns"]
    proc = run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "ix", "--max-tokens", 400, "--store", "text",
                         "--quiet"], check=False)
    assert "modified since analyze" in _one_error_line(proc)


# --- item 3: a stage verifies the directory it reads ---------------------------------------
@pytest.mark.parametrize("ranks", [None, 2])
@pytest.mark.slow
def test_pack_and_sort_refuse_a_flipped_bit_and_write_nothing(sorted_dir, tmp_path, ranks):
    _, m, s = sorted_dir
    for directory, command in ((s, ["pack", "--max-tokens", 400]), (m, ["sort"])):
        bad = tmp_path / f"bad-{directory.name}"
        shutil.copytree(directory, bad)
        shard = bad / _manifest(bad)["shards"][0]["file"]
        # a low bit of a sample id: still a valid id, so only the checksum can tell
        _flip(shard, _buffer_offset(shard, "sample_id", 1) + 8 * 10)
        out = tmp_path / f"out-{directory.name}"
        proc = run_sortpack([command[0], bad, "-o", out, *command[1:], "--quiet"], ranks=ranks, check=False,
                            timeout=60)
        assert "sha256 differs" in _one_error_line(proc) and shard.name in proc.stderr
        assert not out.exists() and not any(p.name.startswith(f".{out.name}") for p in tmp_path.iterdir())


@pytest.mark.slow
def test_a_stage_refuses_an_edited_manifest(sorted_dir, tmp_path):
    _, _, s = sorted_dir
    manifest = _manifest(s)
    manifest["options"]["key"] = "difficulty"  # not a shard: the content_hash sees it
    (s / "manifest.json").write_text(json.dumps(manifest))
    proc = run_sortpack(["pack", s, "-o", tmp_path / "ix", "--max-tokens", 400, "--quiet"], check=False)
    assert "content_hash" in _one_error_line(proc)


# --- item 4: every path a manifest names stays inside its directory --------------------------
@pytest.mark.parametrize("name", ["../outside.arrow", "ABSOLUTE", "sub/../../outside.arrow", ".."])
def test_manifest_paths_outside_the_directory_are_refused_by_every_reader(tmp_path, name):
    ix = pipeline_index(tmp_path / "ix", np.arange(1, 60), max_tokens=200)
    manifest = _manifest(ix)
    shutil.copy(ix / manifest["shards"][0]["file"], tmp_path / "outside.arrow")  # the right bytes, elsewhere
    manifest["shards"][0]["file"] = str(tmp_path / "outside.arrow") if name == "ABSOLUTE" else name
    (ix / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SortpackError, match="not a file inside the directory"):
        PackedIndex(ix)
    for command in ("verify", "inspect"):
        proc = run_sortpack([command, ix], check=False)
        assert "not a file inside" in _one_error_line(proc)


def test_a_symlink_leading_outside_is_refused_and_verify_hashes_nothing_outside(tmp_path):
    ix = pipeline_index(tmp_path / "ix", np.arange(1, 60), max_tokens=200)
    shard = ix / _manifest(ix)["shards"][0]["file"]
    outside = tmp_path / "elsewhere.arrow"
    shutil.move(shard, outside)
    shard.symlink_to(outside)  # the right bytes, but not inside the directory
    with pytest.raises(SortpackError, match="outside"):
        PackedIndex(ix)
    proc = run_sortpack(["verify", ix], check=False)
    assert proc.returncode == 1 and "outside" in proc.stderr
    # a symlink inside the directory is fine
    inside = ix / "real.arrow"
    shutil.move(outside, inside)
    shard.unlink()
    shard.symlink_to(inside.name)
    assert PackedIndex(ix).all_sample_ids().size == 59


@pytest.mark.slow
def test_sorted_and_data_shard_paths_are_checked_too(sorted_dir, tmp_path):
    _, _, s = sorted_dir
    manifest = _manifest(s)
    manifest["shards"][0]["file"] = str(s.resolve() / manifest["shards"][0]["file"])  # absolute, even if right
    (s / "manifest.json").write_text(json.dumps(manifest))
    proc = run_sortpack(["pack", s, "-o", tmp_path / "ix", "--max-tokens", 400, "--quiet"], check=False)
    assert "not a file inside" in _one_error_line(proc)

    data_ix = tmp_path / "store"
    run_sortpack(["run", sorted_dir[0], "-o", data_ix, "--column", "text", "--max-tokens", 400, "--store", "text",
                  "--quiet"])
    manifest = _manifest(data_ix)
    manifest["data"]["shards"][0]["file"] = "../" + manifest["data"]["shards"][0]["file"]
    (data_ix / "manifest.json").write_text(json.dumps(manifest))
    from sortpack.reader import SourceDataset

    with pytest.raises(SortpackError, match=r"data.shards\[0\]"):
        SourceDataset(data_ix)


# --- item 5: corruption is an error naming the file, never wrong data or a crash ------------
def test_a_flipped_id_in_an_index_shard_is_an_error_not_a_duplicate_sample(tmp_path):
    ix = pipeline_index(tmp_path / "ix", np.arange(1, 200) % 90 + 1, max_tokens=300)
    shard = ix / _manifest(ix)["shards"][0]["file"]
    _flip(shard, _buffer_offset(shard, "sample_ids", 1, child=True) + 4 * 7)  # id 7 of the shard, low bit
    with pytest.raises(SortpackError, match=f"{shard.name}: sha256 differs"):
        PackedIndex(ix).all_sample_ids()
    proc = run_sortpack(["verify", ix], check=False)
    assert proc.returncode == 1 and "sha256 mismatch" in proc.stderr


@pytest.mark.parametrize("verify", ["index", "structure"])
def test_a_flipped_list_offset_is_an_error_not_an_over_budget_microbatch(tmp_path, verify):
    ix = pipeline_index(tmp_path / "ix", np.arange(1, 200) % 90 + 1, max_tokens=300)
    shard = ix / _manifest(ix)["shards"][0]["file"]
    at = _buffer_offset(shard, "sample_ids", 1) + 4 * 2  # the end of micro-batch 1 (int32 offsets)
    offsets = np.frombuffer(shard.read_bytes()[at - 8:at + 8], dtype=np.int32)
    assert offsets[1] < offsets[2] < offsets[3]
    _poke(shard, at, np.int32(offsets[3] - 1).tobytes())  # still monotone: only the counts can tell
    index = PackedIndex(ix, verify=verify)
    with pytest.raises(SortpackError, match="sha256 differs" if verify == "index" else "num_samples"):
        index.microbatch(1)
    proc = run_sortpack(["inspect", ix], check=False)
    assert "num_samples" in _one_error_line(proc)


_READ_STORED = """
import sys
from sortpack.reader import PackedIndex
from sortpack.errors import SortpackError
try:
    ix = PackedIndex(sys.argv[1])
    for i in range(len(ix)):
        ix.stored.microbatch(i).to_pylist()
except SortpackError as exc:
    print("refused:", exc)
    sys.exit(3)
print("read everything")
"""


@pytest.mark.slow
def test_a_flipped_offset_in_a_data_shard_is_an_error_not_a_segfault(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl")
    ix = tmp_path / "ix"
    run_sortpack(["run", src, "-o", ix, "--column", "text", "--max-tokens", 400, "--store", "text", "--quiet"])
    shard = ix / _manifest(ix)["data"]["shards"][0]["file"]
    at = _buffer_offset(shard, "text", 1) + 4 * 5 + 3  # the high byte of string offset 5
    _poke(shard, at, b"\x7f")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # in a subprocess: a segfault must fail this test, not end pytest
    proc = subprocess.run([sys.executable, "-c", _READ_STORED, str(ix)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert shard.name in proc.stdout and "corrupt Arrow data" in proc.stdout


def test_verify_full_rehashes_data_shards(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl")
    ix = tmp_path / "ix"
    run_sortpack(["run", src, "-o", ix, "--column", "text", "--max-tokens", 400, "--store", "text", "--quiet"])
    shard = ix / _manifest(ix)["data"]["shards"][0]["file"]
    _flip(shard, _buffer_offset(shard, "text", 2) + 5, 0x02)  # a letter of a text: structure intact
    PackedIndex(ix).stored.microbatch(0)  # the default level reads no values: it cannot tell
    with pytest.raises(SortpackError, match=f"{shard.name}: sha256 differs"):
        PackedIndex(ix, verify="full")
    with pytest.raises(ValueError, match="verify="):
        PackedIndex(ix, verify="sometimes")


# --- item 6: a corrupt resume state is refused, field by field ------------------------------
@pytest.mark.parametrize("field,value,match", [
    ("position", -7, "'position' is -7"),
    ("position", 10**9, "past the epoch"),
    ("epoch", -3, "'epoch' is -3"),
    ("drop_last", "no", "'drop_last' is 'no'"),
    ("seed", 1.5, "'seed' is 1.5"),
    ("layout", [0, 0], "'layout' is \\[0, 0\\]"),
    ("layout", [2], "'layout'"),
    ("grad_accum", "2", "'grad_accum'"),
    ("order", "random", "'order'"),
    ("step", -1, "'step'"),
    ("largest_first", 1, "'largest_first'"),
    ("bogus", 1, "unknown key"),
    ("position", None, "missing key"),
])
def test_sampler_load_state_dict_validates_every_field(tmp_path, field, value, match):
    from sortpack.reader import PackedSampler

    ix = pipeline_index(tmp_path / "ix", np.arange(1, 200) % 90 + 1, max_tokens=300)
    sampler = PackedSampler(ix, rank=0, world_size=2, order="shuffle", seed=3)
    next(iter(sampler))
    state = sampler.state_dict()
    if value is None:
        del state[field]
    else:
        state[field] = value
    fresh = PackedSampler(ix, rank=1, world_size=2)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(state)
    assert fresh.state_dict() == before  # nothing half-loaded
    fresh.load_state_dict(sampler.state_dict())  # the real state still loads


def test_goodput_and_lr_states_are_validated():
    from sortpack.train.goodput import NoiseScale, StepTimeModel

    noise = NoiseScale()
    for bad in ({**noise.state_dict(), "smoothing": 1.5}, {**noise.state_dict(), "steps": -1},
                {**noise.state_dict(), "g2": float("nan")}, {"smoothing": 0.9}, [1, 2]):
        with pytest.raises(ValueError, match="NoiseScale state"):
            noise.load_state_dict(bad)
    times = StepTimeModel()
    times.observe(2, 1.0, 0.4)
    for bad in ({**times.state_dict(), "by_accum": {"0": [1.0, 1.0]}},
                {**times.state_dict(), "micro": [1.0]}):
        with pytest.raises(ValueError, match="StepTimeModel state"):
            times.load_state_dict(bad)
    times.load_state_dict(times.state_dict())


def test_lr_state_is_validated():
    torch = pytest.importorskip("torch")
    from sortpack.torch import VariableBatchSizeLR

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    lr = VariableBatchSizeLR(opt, ref_batch_size=4)
    state = lr.state_dict()
    for key, value in (("ref_batch_size", 0), ("method", "cubic"), ("base_lrs", [0.1, 0.2]), ("scale", "x")):
        with pytest.raises(ValueError, match=f"'{key}'"):
            lr.load_state_dict({**state, key: value})
    lr.load_state_dict(state)


# --- item 11: verify compares sizes before hashing ------------------------------------------
def test_verify_refuses_a_huge_sparse_shard_at_once(tmp_path):
    ix = pipeline_index(tmp_path / "ix", np.arange(1, 60), max_tokens=200)
    shard = ix / _manifest(ix)["shards"][0]["file"]
    os.truncate(shard, 1 << 40)  # 1 TiB of holes: hours to hash
    t0 = time.perf_counter()
    proc = run_sortpack(["verify", ix], check=False, timeout=60)
    assert time.perf_counter() - t0 < 30
    assert proc.returncode == 1 and f"{1 << 40} bytes, the manifest says" in proc.stderr


@pytest.mark.slow
def test_every_flipped_footer_byte_of_an_index_shard_is_one_error(tmp_path):
    # a flipped byte in a column name of the Arrow footer raised UnicodeDecodeError from
    # format/integrity.py: one line, never a traceback
    from sortpack.report.inspect import inspect_directory

    ix = pipeline_index(tmp_path / "ix", np.arange(1, 60), max_tokens=200)
    shard = ix / _manifest(ix)["shards"][0]["file"]
    good = shard.read_bytes()
    undecodable = []
    for k in range(max(0, len(good) - 700), len(good)):  # the footer and its schema
        data = bytearray(good)
        data[k] ^= 0xFF
        shard.write_bytes(bytes(data))
        for read in (lambda: inspect_directory(ix), lambda: PackedIndex(ix).all_sample_ids()):
            try:
                read()
            except SortpackError as exc:
                if "not UTF-8" in str(exc):
                    undecodable.append(k)
            # any other exception fails the test: corrupt data is one error line, never a crash
    shard.write_bytes(good)
    assert undecodable, "no flip hit a column name: the test checks nothing"
    data = bytearray(good)
    data[undecodable[0]] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = run_sortpack(["verify", ix], check=False)  # lists each problem of the shard, one line each
    assert "Traceback" not in proc.stderr and proc.returncode == 1 and "not UTF-8" in proc.stderr, proc.stderr
    assert "corrupt Arrow shard (a column name in its footer is not UTF-8)" in _one_error_line(
        run_sortpack(["inspect", ix], check=False))
