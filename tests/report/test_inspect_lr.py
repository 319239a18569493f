"""inspect warns when a step's LR scale is over 4x the median step's (short samples in one step), only under the LR
rule the training says it uses (--lr-method, --lr-by)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support import run_sortpack, write_text_parquet


@pytest.mark.slow
def test_inspect_warns_about_a_step_of_many_short_samples(tmp_path):
    lengths = np.concatenate([np.full(200, 2), np.random.default_rng(0).integers(150, 200, size=100)])
    src = write_text_parquet(tmp_path / "t.parquet", lengths)
    run_sortpack(["run", src, "-o", tmp_path / "p", "--column", "text", "--max-tokens", "400", "--quiet"])
    # no LR rule given: no LR scaling to warn about (the report says nothing of a feature the user did not choose)
    proc = run_sortpack(["inspect", tmp_path / "p"])
    assert "warning" not in proc.stderr and "warnings" not in json.loads(
        run_sortpack(["inspect", tmp_path / "p", "--json"]).stdout)
    proc = run_sortpack(["inspect", tmp_path / "p", "--lr-method", "sqrt"])
    assert "sortpack: warning: step" in proc.stderr and "sqrt LR scaling by samples" in proc.stderr
    assert 'by="tokens"' in proc.stderr
    report = json.loads(run_sortpack(["inspect", tmp_path / "p", "--json", "--lr-method", "linear"]).stdout)
    assert len(report["warnings"]) == 1 and "linear LR scaling by samples" in report["warnings"][0]
    # scaled by tokens, the many short samples' step is an ordinary one
    assert "warning" not in run_sortpack(["inspect", tmp_path / "p", "--lr-method", "sqrt", "--lr-by", "tokens"]).stderr
    # an even plan has nothing to warn about
    run_sortpack(["run", src, "-o", tmp_path / "q", "--column", "text", "--max-tokens", "400", "--quiet",
                  "--max-samples", "4"])
    assert "warning" not in run_sortpack(["inspect", tmp_path / "q", "--lr-method", "sqrt"]).stderr
