"""The skeleton every job shares (pipeline/job.py): options checked together, the output dropped on failure."""
from __future__ import annotations

import ast

import pytest

from sortpack.errors import SortpackError
from sortpack.inputs.finetune import ChatShape, PairsShape
from sortpack.parallel import SerialComm
from sortpack.pipeline.job import check_options, job_scope, split_check, store_for
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.pack import PackOptions
from sortpack.stages.plan_options import PlanOptions
from sortpack.write.output import OutputDir

from support import ROOT


def test_a_failing_job_leaves_none_of_the_outputs_it_opened(tmp_path):
    comm = SerialComm()
    with pytest.raises(RuntimeError, match="stage failed"):
        with job_scope(comm, str(tmp_path / "out"), False, []) as scope:
            scope.out.ensure()
            scope.also(OutputDir(comm, tmp_path / "out.metrics")).ensure()
            with scope.prof.stage("pack"):
                raise RuntimeError("stage failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # both temporaries gone, nothing committed


def test_a_job_that_succeeds_keeps_its_output(tmp_path):
    comm = SerialComm()
    with job_scope(comm, str(tmp_path / "out"), False, []) as scope:
        (scope.out.ensure() / "data").write_text("x")
        scope.out.commit({"kind": "metrics"})
    assert (tmp_path / "out" / "data").read_text() == "x"


def test_options_are_checked_in_order_and_split_only_when_asked():
    comm = SerialComm()
    calls = []
    check_options(comm, lambda: calls.append(1), None, lambda: calls.append(2))
    assert calls == [1, 2]
    assert split_check(PlanOptions(AnalyzeOptions(), pack=PackOptions(max_tokens=10))) is None
    split = PackOptions(max_tokens=10, oversize="split")
    check_options(comm, split_check(PlanOptions(AnalyzeOptions(), pack=split), "'code' reads 'content'"))
    by_bytes = PlanOptions(AnalyzeOptions(size="bytes", column="t"), pack=split)
    check_options(comm, split_check(by_bytes))
    with pytest.raises(SortpackError, match="--size bytes: not supported yet for a mixture whose sources read"):
        check_options(comm, split_check(by_bytes, "'code' reads 'content'"))
    assert store_for(comm, None, PlanOptions(AnalyzeOptions(), pack=PackOptions(max_tokens=10)), None) is None


@pytest.mark.parametrize("module", ["dataset", "mixture"])
def test_every_job_opens_its_output_through_the_skeleton(module):
    # the skeleton is the one place that opens a job's output and drops it on failure
    tree = ast.parse((ROOT / "sortpack" / "pipeline" / f"{module}.py").read_text())
    jobs = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("run_")]
    assert jobs
    for fn in jobs:
        called = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "job_scope" in called, f"pipeline/{module}.py:{fn.name} does not run in job_scope"
        assert not any(isinstance(n, ast.Attribute) and n.attr == "discard" for n in ast.walk(fn)), fn.name


USAGE_ERRORS = [
    (dict(size2=""), {}, r"--size2 '': expected a SPEC"),
    (dict(), dict(max_size2=10), r"--max-size2 N caps the second size: give --size2 SPEC"),
    (dict(size2=""), dict(max_size2=10), r"--size2 '': expected a SPEC"),
    (dict(), dict(balance="targets"), r"--balance targets balances the loss targets of fine-tuning data"),
    (dict(), dict(rows=64, balance="targets"), r"--balance targets balances the loss targets"),
    (dict(shape=ChatShape(chat_template="t.json", train_on=("assistant", "")), tokenizer="tok.json"), {},
     r"--train-on: expected role names"),
    (dict(shape=PairsShape(prompt_column="q")), {}, r"--prompt-column/--completion-column needs --tokenizer"),
    (dict(shape=PairsShape(prompt_column="q"), tokenizer="tok.json", size="bytes"), {},
     r"--size bytes: a prompt/completion"),
    (dict(shape=PairsShape(encoding="pair", eos_token="</s>"), tokenizer="tok.json", size="tokens"), {},
     r"--eos-token with --pair-encoding pair"),
    (dict(size="tokens:x"), {}, r"--size 'tokens:x': expected"),
]


@pytest.mark.parametrize("analyze,pack,message", USAGE_ERRORS)
def test_a_usage_error_decidable_from_the_options_comes_before_any_work(tmp_path, monkeypatch, analyze, pack,
                                                                        message):
    # the size is a python: SPEC that leaves a marker: no sample may be measured, and no OUT.metrics kept
    from sortpack.pipeline.dataset import JobOutput, run_all
    from sortpack.stages.sort import SortOptions
    from sortpack.write.provenance import JobInfo

    (tmp_path / "marking.py").write_text(
        "import pathlib\nimport pyarrow.compute as pc\n"
        "def size(batch):\n    pathlib.Path(__file__).with_name('measured').touch()\n"
        "    return pc.utf8_length(batch.column('text'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n{"text": "hi"}\n')
    aopts = AnalyzeOptions(**{"column": "text", "size": "python:marking:size", **analyze})
    plan = PlanOptions(aopts, SortOptions(), PackOptions(**{"max_tokens": 64, **pack}))
    with pytest.raises(SortpackError, match=message):
        run_all(SerialComm(), [str(tmp_path / "in.jsonl")], plan, JobOutput(str(tmp_path / "out"), JobInfo([])))
    assert not (tmp_path / "measured").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "marking.py"]


def test_pack_of_a_sorted_directory_refuses_what_its_measures_cannot_pack_before_reading_it(tmp_path, monkeypatch):
    from sortpack.pipeline.dataset import JobOutput, run_analyze, run_pack, run_sort
    from sortpack.stages.sort import SortOptions
    from sortpack.write import sample_dirs
    from sortpack.write.provenance import JobInfo

    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n{"text": "hi"}\n')
    comm = SerialComm()
    run_analyze(comm, [str(tmp_path / "in.jsonl")], AnalyzeOptions(column="text"), JobOutput(str(tmp_path / "m"),
                                                                                               JobInfo([])))
    run_sort(comm, str(tmp_path / "m"), SortOptions(), JobOutput(str(tmp_path / "s"), JobInfo([])))
    def no_read(*args, **kwargs):
        raise AssertionError("the sorted directory was read before the options were checked")

    monkeypatch.setattr(sample_dirs, "read_samples", no_read)
    for pack, message in ((dict(balance="targets"), "--balance targets"), (dict(max_size2=3), "--max-size2 N")):
        with pytest.raises(SortpackError, match=message):
            run_pack(comm, str(tmp_path / "s"), PackOptions(max_tokens=64, **pack),
                     JobOutput(str(tmp_path / "p"), JobInfo([])))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "m", "s"]
