"""``SORTPACK_*`` environment variables (sortpack/env.py): read when used, and a bad integer is one line."""
from __future__ import annotations

import os

import pytest

from sortpack.env import INTEGERS, check_integers, env_int

from support import run_sortpack


@pytest.mark.parametrize("value", ["abc", "1.5", "0x10", "-3", "0"])
def test_a_bad_integer_is_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("SORTPACK_TEST_SHARD_ROWS", value)
    with pytest.raises(ValueError, match=rf"^the environment variable SORTPACK_TEST_SHARD_ROWS={value!r} is not an "
                                            r"integer >= 1; fix or unset it$"):
        env_int("SORTPACK_TEST_SHARD_ROWS")
    with pytest.raises(ValueError, match="SORTPACK_TEST_SHARD_ROWS"):
        check_integers()


def test_integers_unset_empty_or_whole_are_read(monkeypatch):
    for name in INTEGERS:
        monkeypatch.delenv(name, raising=False)
    check_integers()
    assert env_int("SORTPACK_TEST_DATA_ROWS") is None
    monkeypatch.setenv("SORTPACK_TEST_DATA_ROWS", "")
    assert env_int("SORTPACK_TEST_DATA_ROWS") is None
    monkeypatch.setenv("SORTPACK_TEST_DATA_ROWS", " 50 ")
    assert env_int("SORTPACK_TEST_DATA_ROWS") == 50
    check_integers()


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("name", ["SORTPACK_TEST_SHARD_ROWS", "SORTPACK_TEST_PIECE_BYTES", "SORTPACK_TEST_ID_BITS"])
def test_a_job_refuses_a_bad_integer_before_any_work_at_two_ranks(tmp_path, text_dataset, name):
    files, _ = text_dataset
    proc = run_sortpack(["run", *files, "-o", tmp_path / "plan", "--max-tokens", "4096", "--store", "text", "--quiet"],
                        ranks=2, env={name: "many"}, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"Error: the environment variable {name}='many' is not an integer "
                                                f">= {INTEGERS[name]}; fix or unset it"]
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in files)  # no temporary, no output
