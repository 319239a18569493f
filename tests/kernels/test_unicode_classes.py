"""The committed code point classes are the regex engines' (Hugging Face tokenizers' first), reproducibly generated, and
a tokenizers with other tables is noticed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sortpack.kernels import _unicode_ranges as R
from sortpack.kernels import unicode_classes as U

tokenizers = pytest.importorskip("tokenizers")
SAME = tokenizers.__version__ == R.ENGINES["tokenizers"]


def test_the_table_holds_the_committed_ranges():
    table = U.class_table()
    assert table.shape == (U.CODE_POINTS,) and not table.flags.writeable
    for cls, flat in ((U.LETTER, R.LETTERS), (U.NUMBER, R.NUMBERS), (U.SPACE, R.SPACES)):
        got = U.ranges(table, np.arange(U.CODE_POINTS))[cls]
        assert [c for r in got for c in r] == list(flat)
    assert [chr(c) for c in np.flatnonzero(table[:128] == U.SPACE)] == list("\t\n\v\f\r ")
    assert table[ord("é")] == U.LETTER and table[ord("٣")] == U.NUMBER and table[0x3000] == U.SPACE
    assert table[0x1C89] == U.LETTER  # Unicode 16.0: newer than this Python's unicodedata


def test_tokenizers_classes_a_sample_as_the_table_does():
    points = sorted(set(U._probe_points()[::7]) | {0x1C89, 0x31350, 0x2EBF0, 0x323B0, 0x1F600, 0x0301})
    got = U.tokenizers_classes(points)
    if SAME:
        assert got.tolist() == U.class_table()[points].tolist()
    else:  # another tokenizers: the guard decides whether its classes are the table's
        assert (U.same_as_tokenizers() is None) == (got.tolist() == U.class_table()[points].tolist())


def test_another_tokenizers_version_is_probed_and_a_difference_named(monkeypatch):
    monkeypatch.setattr(R, "ENGINES", {**R.ENGINES, "tokenizers": "0.0.1"})
    U.same_as_tokenizers.cache_clear()
    try:
        probed = U.same_as_tokenizers()
        assert probed is None or not SAME
        other = U.class_table().copy()
        other[0x1C89] = U.OTHER  # a letter Unicode 16.0 added, unknown to the table
        monkeypatch.setattr(U, "class_table", lambda: other)
        U.same_as_tokenizers.cache_clear()
        why = U.same_as_tokenizers()
        assert why is not None and "U+1C89" in why
    finally:
        U.same_as_tokenizers.cache_clear()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_committed_ranges_are_what_the_generator_writes_today():
    """Every code point through both engines: with the versions the file records, the generator writes the file
    byte for byte (and tiktoken's engine agrees on every code point)."""
    pytest.importorskip("tiktoken")
    from importlib.metadata import version

    if (version("tokenizers"), version("tiktoken")) != (R.ENGINES["tokenizers"], R.ENGINES["tiktoken"]):
        pytest.skip(f"the ranges were generated with {R.ENGINES}")
    text = U.generate()
    assert text == Path(R.__file__).read_text(encoding="utf-8")
    assert "tiktoken's engine agreed on every code point" in text
