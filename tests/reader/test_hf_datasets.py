"""Hugging Face datasets as input: save_to_disk directories (Dataset and DatasetDict with
--split) and to_parquet files, with sample ids mapping back to the right rows."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from sortpack.errors import SortpackError
from sortpack.inputs.discover import expand_inputs
from sortpack.reader import SourceDataset

from support import run_sortpack

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()


def make_dataset(n: int = 300, seed: int = 0):
    """Return a shuffled Dataset (an indices mapping, as after .shuffle()) of texts of varied length."""
    texts = [f"row{i} " + "x" * ((i * 37) % 101) for i in range(n)]
    return datasets.Dataset.from_dict({"text": texts, "i": list(range(n))}).shuffle(seed=seed)


def metrics_sizes(directory) -> dict[int, int]:
    table = pa.concat_tables(pa.ipc.open_file(str(p)).read_all() for p in sorted(directory.glob("metrics-*.arrow")))
    return dict(zip(table.column("sample_id").to_pylist(), table.column("size").to_pylist()))


@pytest.mark.slow
def test_save_to_disk_directory_reads_its_data_files_in_state_order(tmp_path):
    ds = make_dataset()
    ds.save_to_disk(str(tmp_path / "hf"), num_shards=3)
    # the order is state.json's, not the file names': reverse it and compare with datasets itself
    state = json.loads((tmp_path / "hf" / "state.json").read_text())
    state["_data_files"].reverse()
    (tmp_path / "hf" / "state.json").write_text(json.dumps(state))
    expected = datasets.load_from_disk(str(tmp_path / "hf"))
    files = expand_inputs([str(tmp_path / "hf")])
    assert [p.rsplit("/", 1)[-1] for p, _ in files] == [e["filename"] for e in state["_data_files"]]
    assert {f for _, f in files} == {"arrow"}
    run_sortpack(["analyze", tmp_path / "hf", "-o", tmp_path / "metrics", "--column", "text", "--quiet"])
    sizes = metrics_sizes(tmp_path / "metrics")
    assert sizes == {k: len(expected[k]["text"]) for k in range(len(expected))}
    run_sortpack(["run", tmp_path / "hf", "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "400",
                  "--quiet"])
    rows = SourceDataset(str(tmp_path / "plan"))
    assert len(rows) == len(expected)
    assert [rows[k] for k in range(len(rows))] == [expected[k] for k in range(len(expected))]


def test_a_directory_holding_a_saved_dataset_skips_its_metadata(tmp_path):
    ds = make_dataset(50)
    ds.save_to_disk(str(tmp_path / "data" / "hf"))
    files = expand_inputs([str(tmp_path / "data")])
    assert len(files) == 1 and files[0][0].endswith(".arrow")


@pytest.mark.slow
def test_dataset_dict_needs_split(tmp_path):
    dd = datasets.DatasetDict({"train": make_dataset(200, 1), "test": make_dataset(40, 2)})
    dd.save_to_disk(str(tmp_path / "dd"))
    proc = run_sortpack(["run", tmp_path / "dd", "-o", tmp_path / "plan", "--column", "text", "--max-tokens",
                         "400"], check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "DatasetDict of splits train, test" in lines[0] and "--split" in lines[0]
    assert not (tmp_path / "plan").exists()
    proc = run_sortpack(["analyze", tmp_path / "dd", "-o", tmp_path / "m", "--column", "text", "--split", "dev"],
                        check=False)
    assert proc.returncode == 2 and "--split dev" in proc.stderr and "train, test" in proc.stderr
    run_sortpack(["run", tmp_path / "dd", "--split", "test", "-o", tmp_path / "plan", "--column", "text",
                  "--max-tokens", "400", "--quiet"])
    manifest = json.loads((tmp_path / "plan" / "manifest.json").read_text())
    assert manifest["options"]["split"] == "test" and manifest["num_samples"] == 40
    expected = dd["test"]
    rows = SourceDataset(str(tmp_path / "plan"))
    assert [rows[k] for k in range(40)] == [expected[k] for k in range(40)]
    by_path = SourceDataset(str(tmp_path / "dd"), split="train")
    assert len(by_path) == 200 and by_path[7] == dd["train"][7]
    with pytest.raises(SortpackError, match="choose one with --split"):
        SourceDataset(str(tmp_path / "dd"))


def test_split_without_a_dataset_dict_is_an_error(tmp_path):
    make_dataset(20).save_to_disk(str(tmp_path / "hf"))
    with pytest.raises(SortpackError, match="--split train: no input is a Hugging Face DatasetDict"):
        expand_inputs([str(tmp_path / "hf")], split="train")


def test_to_parquet_output(tmp_path):
    ds = make_dataset(120)
    ds.to_parquet(str(tmp_path / "ds.parquet"))
    run_sortpack(["run", tmp_path / "ds.parquet", "-o", tmp_path / "plan", "--column", "text", "--max-tokens", "400",
                  "--quiet"])
    rows = SourceDataset(str(tmp_path / "plan"))
    assert [rows[k] for k in range(len(ds))] == [ds[k] for k in range(len(ds))]
