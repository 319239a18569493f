"""The column policy (pipeline/columns.py): which column a plan names and which columns its files must hold.

Pure: the files' column names are given, no input is read and no communicator is made.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.pipeline.columns import ColumnPlan, ColumnRequest, plan_columns
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.write.store import StoreOptions


def _files(*columns: list[str], name: str = "f") -> list[tuple[str, list[str]]]:
    return [(f"{name}{i}.parquet", list(c)) for i, c in enumerate(columns)]


def test_a_plan_that_reads_no_column_names_its_column_as_given_without_reading_the_files():
    request = ColumnRequest("body")  # no SPEC reads the text, nothing stored, nothing cut
    assert not request.reads_files
    assert plan_columns(request, None) == ColumnPlan("body", None)
    # even with the names at hand (a missing column is analyze's to report)
    assert plan_columns(request, [_files(["text"])]) == ColumnPlan("body", None)


@pytest.mark.parametrize("columns,chosen", [(["body"], "body"), (["id", "text"], "text"), (["a", "b"], None)])
def test_a_split_plan_names_the_column_analyze_reads(columns, chosen):
    # the store and the reader cut the column the options name, so a split plan names it
    request = ColumnRequest(None, text=True, splitting=True)
    assert plan_columns(request, [_files(columns, columns)]) == ColumnPlan(chosen, [2])
    # --column as given wins
    assert plan_columns(ColumnRequest("a", splitting=True), [_files(["a", "b"])]).column == "a"


def test_a_missing_column_or_store_column_is_one_line_naming_the_file_and_why():
    with pytest.raises(SortpackError, match=r"^f1.parquet: no column 'body' \(--column; its columns: text\)$"):
        plan_columns(ColumnRequest("body", text=True), [_files(["body"], ["text"])])
    with pytest.raises(SortpackError, match=r"^f0.parquet: no column 'meta' \(--store meta; its columns: text\)$"):
        plan_columns(ColumnRequest(None, store=("meta",)), [_files(["text"])])
    # an empty JSONL/CSV file has no columns and no row to read: it passes
    assert plan_columns(ColumnRequest("body", text=True), [_files(["body"], [])]) == ColumnPlan("body", [2])


def test_a_mixture_names_the_plain_sources_column_and_checks_each_source_for_its_own():
    request = ColumnRequest(None, text=True, store=("text",), sources=(("web", None), ("code", "body")))
    files = [_files(["text", "url"], name="w"), _files(["body"], ["body"], name="c")]
    # the plan reads the plain source's column; a source's own column stands for it in --store
    assert plan_columns(request, files) == ColumnPlan("text", [1, 2])
    files[1][1] = ("c1.parquet", ["content"])
    with pytest.raises(SortpackError, match=r"^mixture source 'code': c1.parquet: no column 'body' \(its 'column'"):
        plan_columns(request, files)
    # where no plain source tells, the first source's own column is the plan's
    only_own = ColumnRequest(None, sources=(("a", "x"), ("b", "y")))
    assert plan_columns(only_own, [_files(["x"]), _files(["y"])]).column == "x"


def test_the_text_column_is_checked_in_every_plain_source_where_a_spec_reads_it():
    request = ColumnRequest(None, text=True, sources=(("web", None), ("code", "body"), ("more", None)))
    files = [_files(["text"]), _files(["body"]), _files(["title"], name="m")]
    with pytest.raises(SortpackError, match=r"^mixture source 'more': m0.parquet: no column 'text' \(the text col"):
        plan_columns(request, files)


@pytest.mark.parametrize("size,oversize,splitting", [("bytes", "split", True), ("length", "split", True),
                                                      ("column:n", "split", False), ("bytes", "skip", False)])
def test_the_request_of_a_plan_says_whether_it_cuts_text(size, oversize, splitting):
    request = ColumnRequest.of(AnalyzeOptions(size=size), oversize)
    assert request.splitting is splitting and request.reads_files is splitting


def test_the_request_of_a_stored_plan_names_its_columns_and_whether_it_reads_text():
    stored = ColumnRequest.of(AnalyzeOptions(column="body", size="column:n"), "error",
                              StoreOptions(columns=("body", "id"), tokens=True))
    assert stored.store == ("body", "id") and stored.text and stored.reads_files  # --store-tokens reads the text
    plain = ColumnRequest.of(AnalyzeOptions(column="body", size="column:n"), "error", StoreOptions())
    assert plain.store == () and not plain.text and not plain.reads_files


_NAMES = st.sampled_from(["text", "body", "id", "a"])


@given(st.lists(st.lists(st.lists(_NAMES, min_size=1, max_size=3, unique=True), min_size=1, max_size=3),
                min_size=1, max_size=3),
       st.lists(st.one_of(st.none(), _NAMES), min_size=3, max_size=3), st.one_of(st.none(), _NAMES), st.booleans())
def test_the_plan_column_is_given_or_read_and_every_checked_file_holds_it(groups, owns, column, text):
    sources = tuple((f"s{k}", owns[k]) for k in range(len(groups)))
    request = ColumnRequest(column, text=text, splitting=True, sources=sources)
    files = [_files(*g, name=f"s{k}-") for k, g in enumerate(groups)]
    try:
        plan = plan_columns(request, files)
    except SortpackError as exc:
        assert "no column" in str(exc) and str(exc).startswith("mixture source ")
        return
    assert plan.file_counts == [len(g) for g in groups]
    if column is not None:
        assert plan.column == column
    elif plan.column is not None:
        first_plain = next((c for (_, own), g in zip(sources, groups) if not own for c in g), None)
        assert plan.column in (first_plain or []) or plan.column in [own for _, own in sources]
    for (_, own), g in zip(sources, groups):
        if own:  # a source's own column is in each of its files
            assert all(own in names for names in g)
        elif text and plan.column:  # the text a SPEC reads is in every file of a plain source
            assert all(plan.column in names for names in g)
