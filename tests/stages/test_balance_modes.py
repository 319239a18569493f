"""The --balance registry (stages/pack/balance.py): a mode is one class; its weight, its order, whether it composes
rows and what it refuses are the class's, and nothing outside the table compares a mode's name."""
from __future__ import annotations

import ast

import numpy as np
import pytest

from sortpack.errors import SortpackError
from sortpack.reader import PackedIndex
from sortpack.stages.pack import PackOptions
from sortpack.stages.pack import balance as modes
from sortpack.stages.pack.balance import BALANCE, Balance, balance_of

from reader_fixtures import pipeline_index
from support import ROOT, help_with

PKG = ROOT / "sortpack"


def test_every_mode_is_registered_by_its_name():
    assert list(BALANCE) == ["none", "compute", "targets"]
    got = {name: (balance_of(PackOptions(rows=64, balance=name)).orders, cls.composes_rows)
           for name, cls in BALANCE.items()}
    assert got == {"none": (False, False), "compute": (True, False), "targets": (True, True)}
    assert balance_of(PackOptions(max_tokens=10)).record() == {}
    assert balance_of(PackOptions(max_tokens=10, balance="compute", cost_coeff=8.0)).record() == {
        "balance": "compute", "cost_coeff": 8.0}


def test_no_mode_is_decided_by_its_name_outside_the_table():
    # `balance == "..."` belongs to the mode's class (its weight, order, rows, record, check)
    found = []
    for path in sorted(PKG.rglob("*.py")):
        text = path.read_text()
        if "balance" not in text or (path.name == "balance.py" and path.parent.name == "pack"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "balance"
                    for side in (node.left, *node.comparators)):
                found.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert not found, f"a --balance mode decided by name outside stages/pack/balance.py: {found}"


def test_rows_composed_by_targets_refuse_a_second_cap_in_one_line():
    # before this check, rows were packed by size alone without a word (the command line: test_cli_errors.py)
    with pytest.raises(SortpackError, match=r"^--balance targets composes rows by their loss targets, which "
                                            r"--max-size2 would no longer hold"):
        PackOptions(rows=4096, balance="targets", max_size2=100).validate()
    PackOptions(max_tokens=4096, balance="targets", max_size2=100).validate()  # micro-batches only: ordered


class LongestBalance(Balance):
    """A mode the package does not ship: a micro-batch costs its longest sample (its padded memory), as a weight of
    the samples that the micro-batch's sum makes no sense of: it sets its own cost."""

    name = "longest"
    help = "the longest sample"

    def weight(self, sizes, measures):
        return sizes

    def cost(self, packed):
        return packed.batches.max_size.astype(np.float64)


def test_a_new_mode_is_one_class_and_runs_a_job(tmp_path, monkeypatch):
    monkeypatch.setitem(modes.BALANCE, LongestBalance.name, LongestBalance)
    with pytest.raises(SortpackError, match="--balance longest and --same-shape exclude each other"):
        PackOptions(max_tokens=100, balance="longest", group_size=2, same_shape=True).validate()
    lengths = np.random.default_rng(3).integers(1, 200, 900)
    plan = pipeline_index(tmp_path / "plan", lengths, max_tokens=2000, budget="tokens", balance="longest", stages=2)
    index = PackedIndex(plan)
    assert index.manifest["options"]["balance"] == "longest"
    longest, stage = np.asarray(index["max_size"]), np.asarray(index["stage"])
    for k in np.unique(stage):
        ranked = np.sort(longest[stage == k])  # a circle of the stage's costs: up every other one, then down
        assert longest[stage == k].tolist() == np.concatenate((ranked[0::2], ranked[1::2][::-1])).tolist()
    ids = np.concatenate([index.record(i)[0] for i in range(index.num_microbatches)])
    assert sorted(ids.tolist()) == list(range(len(lengths)))


def test_the_cli_lists_the_modes_of_the_table():
    text = help_with("sortpack.stages.pack.balance", "BALANCE", LongestBalance)
    assert "--balance none|compute|targets|longest" in text and "longest the longest sample." in text
