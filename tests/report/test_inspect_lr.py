"""inspect warns when a step's LR scale is over 4x the median step's (short samples in one step)."""
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
    proc = run_sortpack(["inspect", tmp_path / "p"])
    assert "sortpack: warning: step" in proc.stderr and "by samples" in proc.stderr
    assert 'by="tokens"' in proc.stderr
    report = json.loads(run_sortpack(["inspect", tmp_path / "p", "--json"]).stdout)
    assert len(report["warnings"]) == 1 and "by samples" in report["warnings"][0]
    # an even plan has nothing to warn about
    run_sortpack(["run", src, "-o", tmp_path / "q", "--column", "text", "--max-tokens", "400", "--quiet",
                  "--max-samples", "4"])
    assert "warning" not in run_sortpack(["inspect", tmp_path / "q"]).stderr
