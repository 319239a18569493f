"""Size and difficulty SPECs: sortpack.inputs.specs."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sortpack.errors import SortpackError
from sortpack.inputs.specs import Spec, as_difficulty, as_size, evaluate, load_function, load_tokenizer, parse_spec

from support import make_tokenizer

TEXTS = ["héllo wörld", "", "a  b\tc\n", "数据集", "  lead and trail  ", "x"]
CHARS = [len(s) for s in TEXTS]
UTF8 = [len(s.encode()) for s in TEXTS]
WORDS = [len(s.split()) for s in TEXTS]


def table(**cols) -> pa.Table:
    """Return a table of the given columns (pyarrow arrays or Python lists)."""
    return pa.table(cols)


def ev(text, tbl, column="text", **kw):
    """Parse ``text`` as a --size SPEC on ``column`` and evaluate it on ``tbl``."""
    return evaluate(parse_spec(text, column, "--size"), tbl, "in.parquet", **kw)




# --- parse_spec ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["length", "bytes", "words", "tokens"])
def test_parse_column_kinds(kind):
    assert parse_spec(kind, "text", "--size") == Spec(kind, column="text", text=kind)
    assert parse_spec(kind, "text", "--size").columns() == ["text"]


def test_parse_column_spec():
    assert parse_spec("column:dur", None, "--size") == Spec("column", column="dur", text="column:dur")
    s = parse_spec("column:dur*100", None, "--size")
    assert (s.kind, s.column, s.scale) == ("column", "dur", 100.0)
    assert parse_spec("column:n tokens*0.5", None, "--size").column == "n tokens"
    assert parse_spec("column:d*1e2", None, "--size").scale == 100.0


def test_parse_python_spec():
    s = parse_spec("python:my.mod:size_of", None, "--difficulty")
    assert (s.kind, s.func, s.columns()) == ("python", "my.mod:size_of", None)


@pytest.mark.parametrize("text, column, message", [
    ("len", "text", r"--size 'len': expected length, bytes, words, tokens, image_tokens:COL:SCHEME\[:K=V,...\], .*"
                    r"audio_frames:COL\[\*FPS\], column:NAME\[\*SCALE\] or python"),
    ("", "text", r"--size '': expected length"),
    ("column:", None, r"--size 'column:': expected"),
    ("column:x*0", None, r"--size column:x\*0: scale must be a positive number"),
    ("column:x*-2", None, r"--size column:x\*-2: scale must be a positive number"),
    ("column:x*1e999", None, r"scale must be a positive number"),
    ("column:x*1.2.3", None, r"--size column:x\*1.2.3: bad scale '1.2.3'"),
    ("column:x*abc", None, r"--size 'column:x\*abc': expected"),
    ("python:mod", None, r"--size python:mod: expected python:MODULE:FUNC"),
    ("python:mod:", None, r"expected python:MODULE:FUNC"),
    ("python:a:b:c", None, r"expected python:MODULE:FUNC"),
    ("length", None, r"--size length needs --column"),
    ("words", "", r"--size words needs --column"),
])
def test_parse_errors_name_the_option(text, column, message):
    with pytest.raises(SortpackError, match=message):
        parse_spec(text, column, "--size")


# --- column kinds on every column type ---------------------------------------------


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.string_view()])
def test_text_kinds_on_string_types(typ):
    t = table(text=pa.array(TEXTS, typ))
    assert ev("length", t).tolist() == CHARS  # characters, not bytes
    assert ev("bytes", t).tolist() == UTF8
    assert ev("words", t).tolist() == WORDS
    assert ev("length", t).dtype == np.int64


def test_length_counts_characters_not_bytes():
    t = table(text=["é" * 3, "日本", "🙂"])
    assert ev("length", t).tolist() == [3, 2, 1]
    assert ev("bytes", t).tolist() == [6, 6, 4]


def test_words_splits_on_unicode_whitespace_like_str_split():
    texts = ["a\u3000b", "a\xa0b", "a\vb", "a\u2003b c", "\n\n", "a  ", "  b", " \t ", "a\x1cb"]
    assert ev("words", table(text=texts)).tolist() == [len(s.split()) for s in texts]


def test_text_kinds_on_chunked_and_sliced_column():
    col = pa.chunked_array([pa.array(TEXTS[:2]), pa.array(["zz", "p q"] + TEXTS[2:]).slice(2)])
    t = pa.table({"text": col})
    assert ev("length", t).tolist() == CHARS
    assert ev("words", t).tolist() == WORDS


def test_dictionary_encoded_text():
    t = table(text=pa.array(["ab", "c d", "ab"]).dictionary_encode())
    assert ev("length", t).tolist() == [2, 3, 2]
    assert ev("words", t).tolist() == [1, 2, 1]


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary(), pa.binary_view()])
def test_binary_length_and_bytes(typ):
    t = table(text=pa.array([b"\x00\xff", b"", b"abc"], typ))
    assert ev("length", t).tolist() == [2, 0, 3]
    assert ev("bytes", t).tolist() == [2, 0, 3]


def test_fixed_size_binary():
    t = table(text=pa.array([b"ab", b"cd"], pa.binary(2)))
    assert ev("length", t).tolist() == [2, 2]


@pytest.mark.parametrize("typ", [pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.list_view(pa.int32()),
                                 pa.large_list_view(pa.int16())])
def test_list_length_counts_elements(typ):
    t = table(toks=pa.array([[1, 2, 3], [], [4]], typ))
    assert ev("length", t, "toks").tolist() == [3, 0, 1]


def test_fixed_size_list_length():
    t = table(toks=pa.array([[1, 2], [3, 4]], pa.list_(pa.int8(), 2)))
    assert ev("length", t, "toks").tolist() == [2, 2]


@pytest.mark.parametrize("kind, typ, needs", [
    ("length", pa.int64(), "a string, binary or list column"),
    ("bytes", pa.list_(pa.int32()), "a string or binary column"),
    ("words", pa.binary(), "a string column"),
    ("tokens", pa.binary(), "a string column, or a list of token ids without --tokenizer"),
])
def test_wrong_column_type_names_file_column_and_type(kind, typ, needs):
    values = [[1]] if pa.types.is_list(typ) else ([b"x"] if pa.types.is_binary(typ) else [1])
    t = table(c=pa.array(values, typ))
    with pytest.raises(SortpackError, match=rf"in\.parquet: column 'c' is {typ}; {kind} needs {needs}"):
        ev(kind, t, "c")


def test_tokens_of_token_ids_without_a_tokenizer_are_their_count():
    # a Megatron dataset's sequences: token ids already (analyze asks for a tokenizer unless every input is one)
    t = table(ids=pa.array([[5, 6, 7], [], [1]], pa.list_(pa.uint16())))
    assert ev("tokens", t, "ids").tolist() == [3, 0, 1]


def test_nulls_are_refused():
    t = table(text=["a", None, None])
    with pytest.raises(SortpackError, match=r"in\.parquet: column 'text' has 2 null values"):
        ev("length", t)
    with pytest.raises(SortpackError, match=r"column 'n' has 1 null values"):
        ev("column:n", table(n=[1, None]))


def test_missing_column_in_table():
    with pytest.raises(SortpackError, match=r"in\.parquet: no column 'text' \(columns: other\)"):
        ev("length", table(other=["a"]))


# --- tokens -------------------------------------------------------------------------


def test_tokens_counts_tokenizer_ids(tmp_path):
    path = make_tokenizer(tmp_path / "tokenizer.json")
    tok = load_tokenizer(path)
    texts = ["hello, world!", "héllo wörld", "", "the quick brown fox jumps"]
    got = ev("tokens", table(text=pa.array(texts, pa.large_string())), tokenizer=tok)
    assert got.tolist() == [4, 2, 0, 5]
    assert got.tolist() == [len(tok.encode(s).ids) for s in texts]


def test_tokens_across_chunks(tmp_path):
    tok = load_tokenizer(make_tokenizer(tmp_path / "tokenizer.json"))
    t = pa.table({"text": pa.chunked_array([["hello world"], ["fox!", "a b c"]])})
    assert ev("tokens", t, tokenizer=tok).tolist() == [2, 2, 3]


def test_tokenizer_needed_and_loadable(tmp_path):
    with pytest.raises(SortpackError, match="--size tokens needs --tokenizer"):
        load_tokenizer(None)
    with pytest.raises(SortpackError, match="--difficulty tokens needs --tokenizer"):
        load_tokenizer("", "--difficulty")
    bad = tmp_path / "tok.json"
    bad.write_text("{not a tokenizer")
    with pytest.raises(SortpackError, match=r"--tokenizer .*tok\.json: cannot load"):
        load_tokenizer(str(bad))
    with pytest.raises(SortpackError, match=r"--tokenizer .*missing\.json: cannot load"):
        load_tokenizer(str(tmp_path / "missing.json"))


# --- column:NAME --------------------------------------------------------------------


def test_column_integers_and_bools():
    assert ev("column:n", table(n=pa.array([3, 0, 7], pa.int32()))).dtype == np.int64
    assert ev("column:n", table(n=pa.array([3, 0, 7], pa.uint16()))).tolist() == [3, 0, 7]
    assert ev("column:b", table(b=[True, False])).tolist() == [1, 0]


def test_column_scaled_size_rounds_up_and_difficulty_stays_float():
    t = table(dur=[0.07, 1.234, 2.0, 0.0, 0.29, 0.001])
    values = ev("column:dur*100", t)
    assert values.dtype == np.float64
    size = as_size(values, "in.parquet", "--size column:dur*100")
    # float noise (0.07 * 100 == 7.000000000000001) is not a partial token
    assert size.tolist() == [7, 124, 200, 0, 29, 1] and size.dtype == np.int64
    diff = as_difficulty(values, "in.parquet", "--difficulty column:dur*100")
    assert diff.dtype == np.float64 and diff[1] == pytest.approx(123.4)


def test_column_float_unscaled_rounds_up():
    size = as_size(ev("column:d", table(d=[0.5, 1.0, 1.0000001])), "f", "--size column:d")
    assert size.tolist() == [1, 1, 2]


def test_column_scale_on_integers_gives_floats():
    assert ev("column:n*2", table(n=[1, 2])).tolist() == [2.0, 4.0]


@pytest.mark.parametrize("values, typ", [(["1", "2"], pa.string()), ([[1], [2]], pa.list_(pa.int64()))])
def test_column_not_numeric(values, typ):
    with pytest.raises(SortpackError, match=rf"in\.parquet: column 'n' is {typ}, not numeric \(column:n\)"):
        ev("column:n", table(n=pa.array(values, typ)))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_column_nan_and_inf_refused(value):
    with pytest.raises(SortpackError, match=r"in\.parquet: column:d has 1 NaN or infinite values"):
        ev("column:d", table(d=[1.0, value]))


def test_negative_values_refused():
    with pytest.raises(SortpackError, match=r"in\.parquet: --size column:n has 2 negative values"):
        as_size(ev("column:n", table(n=[1, -1, -5])), "in.parquet", "--size column:n")
    with pytest.raises(SortpackError, match=r"f: --difficulty column:d has 1 negative values"):
        as_difficulty(np.array([-0.5, 1.0]), "f", "--difficulty column:d")


def test_size_too_large_refused():
    with pytest.raises(SortpackError, match="too large for a size"):
        as_size(np.array([1e300]), "f", "--size column:d")


def test_empty_values_pass():
    assert as_size(np.empty(0, np.float64), "f", "x").dtype == np.int64
    assert as_difficulty(np.empty(0, np.int64), "f", "x").size == 0


# --- python:MODULE:FUNC -------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write a module of size functions into tmp_path and put it on sys.path."""
    (tmp_path / "sp_user_funcs.py").write_text(
        "import numpy as np\n"
        "import pyarrow as pa\n"
        "import pyarrow.compute as pc\n"
        "def chars_plus_one(batch):\n"
        "    assert isinstance(batch, pa.RecordBatch)\n"
        "    return pc.add(pc.utf8_length(batch.column('text')), 1)\n"
        "def as_list(batch):\n"
        "    return [len(s) * 0.5 for s in batch.column('text').to_pylist()]\n"
        "def wrong_length(batch):\n"
        "    return np.zeros(batch.num_rows + 1)\n"
        "def broken(batch):\n"
        "    raise ValueError('no\\ngood')\n"
        "def text_values(batch):\n"
        "    return batch.column('text')\n"
        "def with_nulls(batch):\n"
        "    return pa.array([None] * batch.num_rows, pa.int64())\n"
    )
    (tmp_path / "sp_user_broken.py").write_text("raise RuntimeError('import failed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "sp_user_funcs"


def py(name, tbl, module="sp_user_funcs"):
    """Evaluate python:MODULE:NAME on ``tbl``."""
    spec = parse_spec(f"python:{module}:{name}", None, "--size")
    return evaluate(spec, tbl, "in.parquet", func=load_function(spec))


def test_python_function_arrow_result(user_module):
    assert py("chars_plus_one", table(text=["ab", "", "é"])).tolist() == [3, 1, 2]


def test_python_function_list_result_is_float(user_module):
    got = py("as_list", table(text=["abc", "x"]))
    assert got.dtype == np.float64 and got.tolist() == [1.5, 0.5]


def test_python_function_gets_a_batch_on_zero_rows(user_module):
    assert py("chars_plus_one", table(text=pa.array([], pa.string()))).tolist() == []


@pytest.mark.parametrize("name, message", [
    ("wrong_length", r"in\.parquet: python:sp_user_funcs:wrong_length returned 3 values for 2 rows"),
    ("broken", r"in\.parquet: python:sp_user_funcs:broken raised ValueError: no good"),
    ("text_values", r"in\.parquet: python:sp_user_funcs:text_values gave non-numeric or null values"),
    ("with_nulls", r"python:sp_user_funcs:with_nulls (gave non-numeric or null values|has 2 NaN)"),
])
def test_python_function_bad_results(user_module, name, message):
    with pytest.raises(SortpackError, match=message):
        py(name, table(text=["a", "b"]))


@pytest.mark.parametrize("text, message", [
    ("python:sp_user_funcs:nope", r"python:sp_user_funcs:nope: cannot load sp_user_funcs\.nope \(AttributeError"),
    ("python:sp_no_such_module:f", r"cannot load sp_no_such_module\.f \(ModuleNotFoundError"),
    ("python:sp_user_broken:f", r"cannot load sp_user_broken\.f \(RuntimeError: import failed\)"),
])
def test_load_function_errors(user_module, text, message):
    with pytest.raises(SortpackError, match=message):
        load_function(parse_spec(text, None, "--size"))


# --- python:MODULE:FUNC from the current directory ------------------------------------------


def test_python_module_in_the_current_directory(tmp_path, monkeypatch):
    import sys

    (tmp_path / "sp_cwd_funcs.py").write_text("def ones(batch):\n    return [1] * batch.num_rows\n")
    monkeypatch.chdir(tmp_path)
    # as under the `sortpack` console script: sys.path holds neither '' nor the cwd
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    spec = parse_spec("python:sp_cwd_funcs:ones", None, "--size")
    assert evaluate(spec, table(text=["a", "b"]), "in.parquet", func=load_function(spec)).tolist() == [1, 1]


def test_python_module_not_found_says_where_it_looked(tmp_path, monkeypatch):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_function may add the cwd
    spec = parse_spec("python:sp_nowhere_mod:f", None, "--size")
    with pytest.raises(SortpackError) as info:
        load_function(spec)
    msg = str(info.value)
    assert "ModuleNotFoundError" in msg and f"looked in the current directory {tmp_path}" in msg
    assert "sys.path" in msg and "\n" not in msg
