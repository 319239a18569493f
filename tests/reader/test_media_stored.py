"""Media stored with the plan (``--store`` of a binary and a list<binary> column) and read back by SourceDataset and
DataLoader workers, on plans measured by the media size kinds; the same bytes at 1-4 ranks."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.media_data import encode, wav_bytes
from sortpack.reader import PackedIndex, PackedSampler, SourceDataset

from support import assert_same_at_ranks, run_sortpack

pytest.importorskip("PIL")


def _media_dataset(directory, rows: int = 90) -> list[dict]:
    """Write two parquet files of samples with 0-3 images each, one image or none, and a clip; return the rows."""
    rng = np.random.default_rng(4)
    pics = [encode(["png", "jpeg", "webp", "gif"][i % 4], int(w), int(h), i)
            for i, (w, h) in enumerate(rng.integers(8, 60, (12, 2)) * 28)]
    out = []
    for i in range(rows):
        k = int(rng.integers(0, 4))
        out.append({"text": "x" * int(rng.integers(1, 50)),
                    "images": [pics[int(j)] for j in rng.integers(0, 12, k)],
                    "image": pics[i % 12] if i % 5 else None,
                    "audio": wav_bytes(int(rng.integers(100, 20000)), 16000)})
    half = rows // 2
    for n, part in enumerate((out[:half], out[half:])):
        pq.write_table(pa.Table.from_pylist(part), directory / f"part-{n}.parquet", row_group_size=16)
    return out


PLAN = ["--size", "image_tokens:images:qwen2_vl:max_pixels=602112", "--size2", "audio_frames:audio",
        "--max-size2", "2000", "--max-tokens", "6000", "--budget", "tokens", "--keep-empty",
        "--store", "images,image,audio"]


@pytest.mark.slow
def test_stored_media_come_back_in_plan_order_from_the_dataset_and_workers(tmp_path):
    torch = pytest.importorskip("torch")
    from sortpack.torch import PackedBatchSampler

    rows = _media_dataset(tmp_path)
    run_sortpack(["run", tmp_path / "part-0.parquet", tmp_path / "part-1.parquet", "-o", tmp_path / "plan", *PLAN])
    data = SourceDataset(tmp_path / "plan")
    assert data.stored is not None  # read from the plan's data shards, not the parquet files
    seen = []
    for mb in PackedSampler(tmp_path / "plan", rank=0, world_size=1):
        for i, row in zip(mb, data.__getitems__(mb)):
            assert row == {c: rows[i][c] for c in ("images", "image", "audio")}
            seen.append(i)
    assert sorted(seen) == list(range(len(rows)))
    index = PackedIndex(tmp_path / "plan")
    assert int(index["size2"].max()) <= 2000  # the audio frames' cap held
    loader = torch.utils.data.DataLoader(data, batch_sampler=PackedBatchSampler(tmp_path / "plan", rank=0,
                                                                                world_size=1),
                                         num_workers=2, collate_fn=_rows)
    batches = list(PackedSampler(tmp_path / "plan", rank=0, world_size=1))
    for mb, got in zip(batches, loader):
        assert [r["images"] for r in got] == [rows[i]["images"] for i in mb]
        assert [r["image"] for r in got] == [rows[i]["image"] for i in mb]


def _rows(batch: list) -> list:
    """Return a micro-batch's rows as they are (module level: workers pickle it)."""
    return batch


@pytest.mark.mpi
@pytest.mark.slow
def test_media_plans_and_their_stored_bytes_are_the_same_at_1_to_4_ranks(tmp_path):
    _media_dataset(tmp_path, rows=70)
    args = ["run", tmp_path / "part-0.parquet", tmp_path / "part-1.parquet", *PLAN]
    assert_same_at_ranks(args, tmp_path, env={"SORTPACK_TEST_DATA_ROWS": "9", "SORTPACK_TEST_SHARD_ROWS": "4"})
