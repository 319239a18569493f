"""A fine-tuning shape is one class: a shape the package does not ship (a text column trained whole) is written as
one ``FineTuneShape`` subclass, registered in ``SHAPES``, and runs a job: run, the staged route that encodes it
again from the plan's record, the stored labels and a collate's ``tokenize=``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from sortpack.inputs.finetune import SHAPES, FineTuneShape, Rows
from sortpack.inputs.finetune.encoded import encoded, flat_ids
from sortpack.parallel import SerialComm
from sortpack.pipeline.dataset import JobInfo, JobOutput, run_all, run_pack, run_sort
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.pack import PackOptions
from sortpack.stages.plan_options import PlanOptions
from sortpack.stages.sort import SortOptions
from sortpack.write.store import StoreOptions

from support import make_chat_tokenizer, read_manifest


@dataclass(frozen=True, eq=False, kw_only=True)
class DocumentShape(FineTuneShape):
    """A plain text column trained whole: every token after the first is a target (continued pre-training)."""

    name: ClassVar[str] = "document"
    option: ClassVar[str] = "--document-column"

    column: str = "text"

    def columns(self) -> list[str]:
        return [self.column]

    def text_columns(self) -> list[str]:
        return [self.column]

    def encode_rows(self, table, rows: Rows):
        encs = self.tokenizer.encode_batch(table.column(self.column).to_pylist(), add_special_tokens=True)
        ids, counts = flat_ids(encs)
        return encoded([ids], [np.ones(len(ids), dtype=bool)], [counts])

    def record(self) -> dict:
        return {"shape": self.name, "column": self.column,
                **({"tokenizer_sha256": self.tokenizer_sha256} if self.tokenizer_sha256 else {})}

    @classmethod
    def from_record(cls, record: dict, column: str | None) -> DocumentShape:
        return cls(column=record["column"], tokenizer_sha256=record.get("tokenizer_sha256"))


@pytest.mark.slow
def test_a_shape_the_package_does_not_ship_runs_a_job(tmp_path, monkeypatch):
    monkeypatch.setitem(SHAPES, DocumentShape.name, DocumentShape)
    tokenizer, _ = make_chat_tokenizer(tmp_path / "tok")
    rng = np.random.default_rng(2)
    words = "the quick brown fox jumps over the lazy dog hello world".split()
    texts = [" ".join(rng.choice(words, int(n))) for n in rng.integers(1, 90, 150)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    comm, job = SerialComm(), JobInfo(["test"])
    store = StoreOptions(tokens=True)
    aopts = AnalyzeOptions(shape=DocumentShape(column="text"), tokenizer=tokenizer)
    popts = PackOptions(max_tokens=96, budget="tokens", oversize="split")
    run_all(comm, [str(tmp_path / "docs.jsonl")], PlanOptions(aopts, SortOptions(), popts),
            JobOutput(str(tmp_path / "run"), job, store=store, keep_intermediate=True))
    manifest = read_manifest(tmp_path / "run")
    assert manifest["options"]["fine_tune"]["shape"] == "document" and manifest["data"]["columns"] == [
        "input_ids", "labels"]
    from tokenizers import Tokenizer

    sizes = [len(Tokenizer.from_file(tokenizer).encode(t).ids) for t in texts]
    assert manifest["stats"]["tokens"] == sum(sizes)
    assert manifest["stats"]["targets"] == sum(sizes) - manifest["num_samples"]  # every piece's first position
    # the staged route: the sorted directory's record gives the shape back, typed, and pack encodes it again
    run_sort(comm, str(tmp_path / "run.metrics"), SortOptions(), JobOutput(str(tmp_path / "s"), job))
    run_pack(comm, str(tmp_path / "s"), popts, JobOutput(str(tmp_path / "p"), job,
                                                         store=StoreOptions(tokens=True, tokenizer=tokenizer)))
    assert read_manifest(tmp_path / "p")["content_hash"] == manifest["content_hash"]
    recorded = PlanOptions.from_manifest(read_manifest(tmp_path / "s")["options"]).analyze.shape
    assert type(recorded) is DocumentShape and recorded.record() == manifest["options"]["fine_tune"]
    # loaded, the shape is a collate's tokenize=: the labels the plan stored
    torch = pytest.importorskip("torch")
    from sortpack.reader import PackedIndex, SourceDataset
    from sortpack.torch import PackedBatchSampler, varlen_collate

    loaded = recorded.loaded_from(tokenizer, manifest["options"]["tokenizer"], None, "test")
    stored, raw = SourceDataset(tmp_path / "run"), SourceDataset(tmp_path / "run", columns=["text"])
    for mb in list(PackedBatchSampler(PackedIndex(tmp_path / "run"), rank=0, world_size=1))[:5]:
        a = varlen_collate(key="input_ids")(stored.__getitems__(mb))
        b = varlen_collate(tokenize=loaded)(raw.__getitems__(mb))
        assert torch.equal(a["labels"], b["labels"]) and torch.equal(a["input_ids"], b["input_ids"])


def test_a_record_of_a_shape_this_sortpack_does_not_know_is_one_line():
    from sortpack.errors import SortpackError
    from sortpack.inputs.finetune import shape_from_record

    with pytest.raises(SortpackError, match=r"fine-tuning shape 'document' is not one this sortpack knows "
                                            r"\(labels, prompt_completion, chat\)"):
        shape_from_record({"shape": "document", "column": "text"}, None)
