"""The skeleton every job shares (pipeline/job.py): options checked together, the output dropped on failure."""
from __future__ import annotations

import ast

import pytest

from sortpack.errors import SortpackError
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
