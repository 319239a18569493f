"""A plan's options as one record: what a manifest records reads back as the same typed options."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.format.manifest import read_manifest
from sortpack.inputs.finetune import ChatShape, LabelsShape, PairsShape
from sortpack.parallel import SerialComm
from sortpack.pipeline.dataset import JobInfo, JobOutput, run_all, run_pack
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.pack import PackOptions
from sortpack.stages.plan_options import PlanOptions
from sortpack.stages.sort import SortOptions
from sortpack.write.store import StoreOptions

from support import write_text_parquet

names = st.sampled_from(["text", "input_ids", "content"])
specs = st.sampled_from(["length", "bytes", "words", "tokens", "column:n", "column:n*100"])
analyze_options = st.builds(
    AnalyzeOptions, column=st.none() | names, size=specs, difficulty=st.none() | specs,
    tokenizer=st.none() | st.sampled_from(["tok.json", "/models/a/tokenizer.json"]),
    input_format=st.sampled_from(["auto", "parquet", "jsonl"]), special_tokens=st.booleans(),
    split=st.none() | st.sampled_from(["train", "test"]), size2=st.none() | st.just("column:patches"))
digests = st.none() | st.just("ab" * 32)
shapes = st.one_of(
    st.builds(LabelsShape, labels_column=st.just("labels"), column=names),
    st.builds(PairsShape, prompt_column=st.just("q"), completion_column=st.just("a"),
              encoding=st.sampled_from(["trl", "pair"]), tokenizer_sha256=digests).map(
        lambda s: dataclasses.replace(s, eos_token="</s>") if s.encoding == "trl" else s),
    st.builds(ChatShape, chat_template=st.just("/t/chat.jinja"), train_on=st.just(("assistant",)) | st.just(
        ("assistant", "user")), template_sha256=digests, tokenizer_sha256=digests))
fine_tune_options = st.builds(AnalyzeOptions, shape=shapes, tokenizer=st.just("tok.json"),
                              column=st.none() | names)
sort_options = st.builds(SortOptions, key=st.sampled_from(["size", "difficulty"]), descending=st.booleans(),
                         stages=st.integers(1, 8))
pack_options = st.one_of(
    st.builds(PackOptions, max_tokens=st.integers(1, 1 << 20), budget=st.sampled_from(["padded", "tokens"]),
              max_samples=st.integers(0, 64), batch_multiple=st.integers(1, 8), pad_to_multiple=st.integers(0, 64),
              oversize=st.sampled_from(["error", "skip", "truncate", "split"]), keep_empty=st.booleans(),
              max_size2=st.integers(0, 100), balance=st.sampled_from(["none", "compute", "targets"]),
              cost_coeff=st.floats(0, 1e4)),
    st.builds(PackOptions, max_tokens=st.integers(1, 4096), shapes=st.just((128, 256)),
              auto_shapes=st.none() | st.integers(1, 4), static_shapes=st.booleans(),
              group_size=st.integers(1, 4), same_shape=st.booleans()),
    st.builds(PackOptions, rows=st.integers(1, 8192), rows_per_microbatch=st.integers(1, 4),
              max_segments=st.integers(0, 8)),
    st.builds(PackOptions, max_tokens=st.integers(1, 4096), budget=st.just("quadratic"),
              quadratic_scale=st.floats(1, 1e4)))
plan_options = st.builds(PlanOptions, analyze=analyze_options | fine_tune_options, sort=st.none() | sort_options,
                         pack=st.none() | pack_options, empty_size=st.integers(0, 3))


@given(plan=plan_options)
def test_what_a_manifest_records_reads_back_unchanged(plan):
    recorded = plan.to_manifest()
    back = PlanOptions.from_manifest(recorded)
    assert back.to_manifest() == recorded
    assert (back.sort, back.pack is None, back.empty_size) == (plan.sort, plan.pack is None, plan.empty_size)


def test_the_options_records_are_read_only():
    for record in (AnalyzeOptions(), SortOptions(), StoreOptions(), PlanOptions(AnalyzeOptions())):
        field = dataclasses.fields(record)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, None)
    # the defaults fine-tuning shapes imply are set at construction, and kept by a copy
    opts = dataclasses.replace(AnalyzeOptions(shape=PairsShape(prompt_column="q")), tokenizer="t.json")
    assert opts.size == "tokens" and AnalyzeOptions(shape=LabelsShape()).column == "input_ids"


def test_the_fine_tuning_shape_reads_back_typed_and_equal():
    # AnalyzeOptions holds the shape as an object: what PlanOptions records comes back as the same shape, typed
    for shape in (LabelsShape(labels_column="lab", column="ids"),
                  PairsShape(prompt_column="q", encoding="trl", eos_token="</s>", tokenizer_sha256="c" * 64),
                  PairsShape(encoding="pair"), ChatShape(chat_template="/m/tokenizer_config.json",
                                                         train_on=("user", "assistant"), template_sha256="d" * 64)):
        plan = PlanOptions(AnalyzeOptions(shape=shape, tokenizer="tok.json"))
        back = PlanOptions.from_manifest(plan.to_manifest()).analyze.shape
        assert type(back) is type(shape) and back.record() == shape.record()
        if not isinstance(shape, ChatShape):  # a chat's record keeps the template's file name, not its path
            assert back == shape


def test_every_directory_the_pipeline_writes_reads_back_as_its_options(tmp_path):
    lengths = np.random.default_rng(5).integers(1, 400, size=600)
    path = write_text_parquet(tmp_path / "a.parquet", lengths, 200)
    out = tmp_path / "plan"
    aopts, sopts = AnalyzeOptions(column="text", difficulty="words"), SortOptions(key="difficulty", stages=2)
    popts = PackOptions(max_tokens=512, shapes=(), auto_shapes=2, oversize="split")
    run_all(SerialComm(), [str(path)], PlanOptions(aopts, sopts, popts),
            JobOutput(str(out), JobInfo(["test"]), keep_intermediate=True))
    metrics, ordered, index = (read_manifest(f"{out}{suffix}") for suffix in (".metrics", ".sorted", ""))
    for manifest in (metrics, ordered, index):
        assert PlanOptions.from_manifest(manifest["options"]).to_manifest() == manifest["options"]
    plan = PlanOptions.from_manifest(index["options"])
    assert plan.analyze == aopts and plan.sort == sopts and PlanOptions.from_manifest(metrics["options"]).sort is None
    assert plan.pack is not None and plan.pack.auto_shapes == 2 and len(plan.pack.shapes) >= 1  # the chosen lengths
    # pack of the sorted directory records the same options as run did
    run_pack(SerialComm(), f"{out}.sorted", popts, JobOutput(str(tmp_path / "again"), JobInfo(["test"])))
    assert read_manifest(tmp_path / "again")["options"] == index["options"]
