"""The size kinds, one row each: sortpack.inputs.size_kinds."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from sortpack.errors import SortpackError
from sortpack.inputs import size_kinds
from sortpack.inputs.size_kinds import SIZE_KINDS, SizeKind, reads_text, size_kind, split_kinds
from sortpack.inputs.specs import evaluate, parse_spec

from support import ROOT


def test_the_table_says_what_each_kind_reads_measures_and_cuts():
    assert list(SIZE_KINDS) == ["length", "bytes", "words", "tokens", "image_tokens", "image_patches", "image_count",
                                "audio_frames"]
    assert split_kinds() == ("length", "bytes", "tokens")
    # the media kinds name their own column: they never read the text column
    assert not reads_text("image_tokens:images:qwen2_vl", "audio_frames:audio*100", "image_tokens")
    assert SIZE_KINDS["length"].cuts_column and SIZE_KINDS["bytes"].cuts_column
    assert not SIZE_KINDS["tokens"].cuts_column and not SIZE_KINDS["words"].can_split
    assert reads_text("words") and reads_text("column:n", "tokens") and not reads_text("column:n", "python:m:f")
    assert size_kind("column:n") is None and size_kind(None) is None


def test_a_new_size_kind_is_one_row(monkeypatch):
    # parse, evaluate, "reads the text column" and the split check all come from the row
    def vowels(col, tokenizer=None, special_tokens=True):
        import pyarrow.compute as pc

        if not pa.types.is_string(col.type):
            return None
        return pc.count_substring_regex(col, "[aeiou]").to_numpy().astype(np.int64)

    monkeypatch.setitem(SIZE_KINDS, "vowels", SizeKind(vowels, "a string column"))
    spec = parse_spec("vowels", "text", "--size")
    table = pa.table({"text": ["banana", "sky", "queue"]})
    assert evaluate(spec, table, "t").tolist() == [3, 0, 4]
    assert reads_text("vowels") and "vowels" not in split_kinds()
    with pytest.raises(SortpackError, match="vowels needs a string column"):
        evaluate(spec, pa.table({"text": [1, 2]}), "t")


def test_the_table_loads_neither_numpy_nor_pyarrow():
    # --help lists the kinds and the input formats on a login node
    code = ("import sys, sortpack.inputs.size_kinds, sortpack.inputs.formats; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pyarrow'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=str(ROOT), env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stderr
    assert size_kinds.__doc__ and "one row" in size_kinds.__doc__
