"""The per-sample measures (inputs/measures.py): one declaration each, which analyze, the split, the empty-sample
filter, the reader and inspect ask; a name the table does not declare is a --measure with the defaults."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.errors import SortpackError
from sortpack.inputs import measures
from sortpack.inputs.measures import MEASURES, Measure, measure_of, parse_measure
from sortpack.parallel import SerialComm
from sortpack.reader import PackedIndex, PackedSampler
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.pack import PackOptions
from sortpack.stages.plan_options import PlanOptions
from sortpack.stages.sort import SortOptions
from sortpack.stages.split import check_split


def test_the_table_declares_what_is_each_measure_s_own():
    assert list(MEASURES) == ["size2", "targets"]
    assert (MEASURES["size2"].option, MEASURES["size2"].pieces, MEASURES["size2"].trains) == ("--size2", None, False)
    assert (MEASURES["targets"].pieces, MEASURES["targets"].trains) == ("labels", True)
    assert measure_of("images") == Measure("images") and measure_of("images").option == "--measure images"


@pytest.mark.parametrize("text,why", [("images", "expected NAME=SPEC"), ("=column:n", "expected NAME=SPEC"),
                                      ("tokens=column:n", "cannot name a measure"),
                                      ("2x=column:n", "cannot name a measure"),
                                      ("targets=column:n", "targets is measured by the fine-tuning shape"),
                                      ("size2=column:n", "size2 is measured by --size2")])
def test_a_measure_it_cannot_take_is_one_line(text, why):
    with pytest.raises(SortpackError, match=why):
        parse_measure(text)
    assert parse_measure(" images = column:n ") == ("images", "column:n")


def test_a_new_measure_is_one_row_and_runs_a_job(tmp_path, monkeypatch):
    # a measure the package does not ship, declared as one row: images whose patches a split cannot share out
    from sortpack.pipeline.dataset import JobInfo, JobOutput, run_all

    monkeypatch.setitem(measures.MEASURES, "images", Measure("images", pieces=None))
    rng = np.random.default_rng(2)
    lengths, images = rng.integers(1, 400, 300), rng.integers(0, 4, 300)
    pq.write_table(pa.table({"text": ["x" * int(n) for n in lengths], "n_images": images}), tmp_path / "a.parquet")
    analyze = AnalyzeOptions(column="text", measures=(("images", "column:n_images"),))
    plan = PlanOptions(analyze, SortOptions(), PackOptions(max_tokens=1000, oversize="split"))
    with pytest.raises(SortpackError, match=r"cuts a sample's size, not its --measure images column:n_images"):
        check_split(plan)
    check_split(PlanOptions(AnalyzeOptions(column="text", measures=(("words", "words"),)), SortOptions(),
                            plan.pack))  # undeclared: its pieces share it out
    run_all(SerialComm(), [str(tmp_path / "a.parquet")], PlanOptions(analyze, SortOptions(),
                                                                    PackOptions(max_tokens=1000)),
            JobOutput(str(tmp_path / "plan"), JobInfo(argv=["tests"])))
    index = PackedIndex(tmp_path / "plan")
    assert index.sum_columns == ("attention", "images") and index.manifest["stats"]["images"] == int(images.sum())
    assert PlanOptions.from_manifest(index.manifest["options"]).analyze == analyze
    for mb in PackedSampler(index, rank=0, world_size=1):
        assert mb.measures == {"images": int(images[list(mb)].sum())} and mb.info()["images"] == mb.measures["images"]
