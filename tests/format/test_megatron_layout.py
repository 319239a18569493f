"""Megatron's .idx layout read and written: sortpack.format.megatron."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.format.megatron import (
    DTYPES,
    HEADER_BYTES,
    IndexLayout,
    check_bin,
    header,
    index_arrays,
    index_bytes,
    read_index,
    smallest_dtype,
)

from megatron_files import megatron_core, write_dataset

INT_DTYPES = [d for d in DTYPES.values() if d.kind in "iu"]


def _idx(tmp_path, sequences, dtype=np.uint16, **kw) -> bytes:
    return write_dataset(tmp_path / "d", sequences, dtype, **kw).read_bytes()


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_read_index_every_integer_dtype(tmp_path, dtype):
    seqs = [[1, 2, 3], [4], [5, 6]]
    index = read_index(_idx(tmp_path, seqs, dtype), "d.idx")
    assert index.dtype == dtype and index.num_sequences == 3
    assert index.lengths.tolist() == [3, 1, 2]
    assert index.pointers.tolist() == [0, 3 * dtype.itemsize, 4 * dtype.itemsize]
    assert index.documents.tolist() == [0, 1, 2, 3] and index.modes is None
    assert index.contiguous() and index.bin_bytes() == 6 * dtype.itemsize


def test_read_index_with_modes_and_documents(tmp_path):
    index = read_index(_idx(tmp_path, [[1], [2, 3], [4]], documents=[0, 2, 3], modes=[0, 1, 0]), "d.idx")
    assert index.documents.tolist() == [0, 2, 3] and index.modes.tolist() == [0, 1, 0]


def test_an_empty_dataset(tmp_path):
    index = read_index(_idx(tmp_path, []), "d.idx")
    assert index.num_sequences == 0 and index.bin_bytes() == 0 and index.contiguous()


@pytest.mark.parametrize("change, message", [
    (lambda b: b"XXIDIDX\x00\x00" + b[9:], "not a Megatron index"),
    (lambda b: b[:9] + (2).to_bytes(8, "little") + b[17:], "version 2"),
    (lambda b: b[:17] + bytes([9]) + b[18:], "unknown dtype code 9"),
    (lambda b: b[:17] + bytes([7]) + b[18:], "float32.*holds no token ids"),
    (lambda b: b[:-8], "truncated"),
    (lambda b: b + b"\x00" * 5, "truncated"),
    (lambda b: b[:20], "shorter than a Megatron index header"),
    (lambda b: b[:-8] + (7).to_bytes(8, "little"), "document indices do not run from 0"),
])
def test_read_index_refuses_a_bad_file_in_one_line(tmp_path, change, message):
    good = _idx(tmp_path, [[1, 2], [3]])
    with pytest.raises(SortpackError, match=message) as err:
        read_index(change(good), "bad.idx")
    assert str(err.value).startswith("bad.idx: ") and "\n" not in str(err.value)


def test_read_index_refuses_a_negative_length(tmp_path):
    raw = bytearray(_idx(tmp_path, [[1, 2], [3]]))
    raw[HEADER_BYTES:HEADER_BYTES + 4] = (-1).to_bytes(4, "little", signed=True)
    with pytest.raises(SortpackError, match="sequence 0 has a negative length"):
        read_index(bytes(raw), "bad.idx")


def test_check_bin_names_the_sequence_past_the_end(tmp_path):
    index = read_index(_idx(tmp_path, [[1, 2], [3, 4, 5]]), "d.idx")
    check_bin(index, 10, "d.bin")
    with pytest.raises(SortpackError, match=r"d.bin: 9 bytes, but sequence 1 of the index ends at byte 10"):
        check_bin(index, 9, "d.bin")


def test_index_arrays_continue_a_run():
    lengths, pointers, docs = index_arrays(np.array([3, 1, 2]), np.array([2, 1]), seq0=10, tok0=100, itemsize=2)
    assert lengths.dtype == np.dtype("<i4") and lengths.tolist() == [3, 1, 2]
    assert pointers.tolist() == [200, 206, 208]
    assert docs.tolist() == [12, 13]


def test_header_and_layout_match_the_reader():
    raw = header(np.dtype(np.int32), 3, 2)
    assert len(raw) == HEADER_BYTES == 34
    layout = IndexLayout.of(3, 2)
    assert (layout.lengths, layout.pointers, layout.documents, layout.total) == (34, 46, 70, index_bytes(3, 2))


@pytest.mark.parametrize("low, high, want", [
    (0, 255, np.uint16), (0, 65535, np.uint16), (0, 65536, np.int32), (0, 2**31 - 1, np.int32),
    (0, 2**31, np.int64), (-100, 32767, np.int16), (-100, 32768, np.int32), (-(2**40), 5, np.int64)])
def test_smallest_dtype(low, high, want):
    assert smallest_dtype(low, high) == np.dtype(want)


@settings(deadline=None)
@given(st.lists(st.lists(st.integers(0, 65535), max_size=20), max_size=30), st.sampled_from(INT_DTYPES))
def test_read_index_agrees_with_the_bytes_written(sequences, dtype):
    import tempfile
    from pathlib import Path

    info = np.iinfo(dtype)
    sequences = [[min(v, info.max) for v in s] for s in sequences]
    with tempfile.TemporaryDirectory() as d:
        idx = write_dataset(Path(d) / "x", sequences, dtype)
        index = read_index(idx.read_bytes(), "x.idx")
        data = np.frombuffer((Path(d) / "x.bin").read_bytes(), dtype=dtype)
    got = [data[p // dtype.itemsize:p // dtype.itemsize + n].tolist()
           for p, n in zip(index.pointers.tolist(), index.lengths.tolist())]
    assert got == sequences


@pytest.mark.slow
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_the_test_files_are_megatron_cores_bytes(tmp_path, dtype):
    # tests/megatron_files.py writes what megatron-core's own builder writes, byte for byte
    mc = megatron_core()
    import torch

    seqs = [[1, 2, 3], [4], [5, 6], []]
    builder = mc.IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=dtype.type)
    for s in seqs:
        builder.add_item(torch.tensor(s, dtype=torch.int64))
        builder.end_document()
    builder.finalize(str(tmp_path / "m.idx"))
    write_dataset(tmp_path / "t", seqs, dtype)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"t{ext}").read_bytes() == (tmp_path / f"m{ext}").read_bytes()
    index = read_index((tmp_path / "m.idx").read_bytes(), "m.idx")
    theirs = mc.IndexedDataset(str(tmp_path / "m"))
    assert np.array_equal(index.lengths, theirs.sequence_lengths)
    assert np.array_equal(index.documents, theirs.document_indices)
