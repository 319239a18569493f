"""Error messages on one line."""
from __future__ import annotations

from sortpack.errors import SortpackError, one_line


def test_one_line_joins_whitespace_and_names_silent_errors():
    assert one_line(ValueError("bad\n  value\tin\r\nfile")) == "bad value in file"
    assert one_line(SortpackError("x.parquet: no rows")) == "x.parquet: no rows"
    assert one_line(RuntimeError()) == "RuntimeError"
    assert one_line("  two\nlines ") == "two lines"
    assert one_line("") == ""
