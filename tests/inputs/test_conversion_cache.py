"""The proven tiktoken conversion kept on disk (``inputs/conversion_cache.py``): read only when whole and matching,
the same ids either way, off with ``SORTPACK_CACHE_DIR=0``."""
from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("tiktoken")

from tokenizer_fixtures import EDGE, train  # noqa: E402

from sortpack.inputs import bpe_conversion, conversion_cache, fast_tokens  # noqa: E402


@pytest.fixture
def trained(tmp_path, sources):
    """Return a trained Llama 3-style tokenizer.json (tiktoken gives its ids) and its texts."""
    return train(tmp_path / "tok.json", "llama3", sources[:10], vocab=800), sources[:5] + EDGE


def _convert(path: str):
    """Return ``fast_tokens._convert`` of ``path`` as a fresh process would (no in-process memo): tiktoken's Encoding
    and the conversion, or why none."""
    from tokenizers import Tokenizer

    got = fast_tokens._convert(path, lambda: Tokenizer.from_file(path))
    return got if isinstance(got, str) else (got.encoding, got.conv)


def _ids(got, texts: list[str]) -> list[list[int]]:
    enc, _ = got
    return [enc.encode(t, allowed_special="all") for t in texts]


def _entries(folder) -> list:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_proven_conversion_is_read_back_and_gives_the_same_ids(trained, tmp_path, monkeypatch):
    path, texts = trained
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(tmp_path / "cache"))
    first = _convert(path)
    assert len(_entries(tmp_path / "cache")) == 1

    def no_proof(*_):
        raise AssertionError("proven again although the entry is whole")

    monkeypatch.setattr(fast_tokens, "exact_conversion", no_proof)
    again = _convert(path)
    assert again[1] == first[1]  # pattern, ranks, special tokens, prefix and suffix alike
    assert _ids(again, texts) == _ids(first, texts)


@pytest.mark.parametrize("damage", ["truncate", "flip", "other key", "other pattern", "token count", "not an entry"])
def test_a_damaged_entry_is_proven_again_never_read(trained, tmp_path, monkeypatch, damage):
    path, texts = trained
    folder = tmp_path / "cache"
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(folder))
    want = _convert(path)
    entry = folder / _entries(folder)[0]
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[-10] ^= 0x01  # one bit of one token's bytes
    elif damage == "other key":
        data = data.replace(entry.name[4:].encode(), b"0" * 64, 1)
    elif damage == "other pattern":  # a header that parses, its body whole
        data = data.replace(b'"pattern": "', b'"pattern": "x|', 1)
    elif damage == "token count":
        data = data.replace(b'"tokens": ', b'"tokens": 9', 1)
    else:
        data = bytearray(b"{}\n")
    entry.write_bytes(bytes(data))
    proofs = []
    real = bpe_conversion.exact_conversion
    monkeypatch.setattr(fast_tokens, "exact_conversion", lambda spec, hf: proofs.append(1) or real(spec, hf))
    got = _convert(path)
    assert proofs == [1] and got[1] == want[1] and _ids(got, texts) == _ids(want, texts)
    assert conversion_cache.load(entry.name[4:]) == want[1]  # written whole again


def test_another_file_content_is_another_entry(trained, tmp_path, monkeypatch, sources):
    path, _ = trained
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(tmp_path / "cache"))
    _convert(path)
    other = train(tmp_path / "tok2.json", "gpt2", sources[:10], vocab=700)
    _convert(other)
    assert len(_entries(tmp_path / "cache")) == 2


def test_off_unwritable_or_refused_writes_nothing_and_still_converts(trained, tmp_path, monkeypatch):
    path, texts = trained
    monkeypatch.setenv("SORTPACK_CACHE_DIR", "0")
    want = _convert(path)
    assert conversion_cache.cache_dir() is None
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(blocker / "cache"))
    got = _convert(path)
    assert _ids(got, texts) == _ids(want, texts) and blocker.read_text() == "not a directory"
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fast_tokens, "exact_conversion", _refuse)
    assert _convert(path) == "refused here"
    assert _entries(tmp_path / "cache") == []


def _refuse(spec, hf):
    raise bpe_conversion.Refused("refused here")


def test_the_default_directory_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SORTPACK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert conversion_cache.cache_dir() == tmp_path / "sortpack"


@pytest.fixture
def parses(monkeypatch):
    """Return the list of tokenizer files parsed by Hugging Face ``tokenizers`` from now on, in a process that has
    loaded none (no in-process memo of conversions or tokenizers)."""
    from sortpack.inputs import specs

    monkeypatch.setattr(fast_tokens, "_MEMO", {})
    monkeypatch.setattr(specs, "_TOKENIZERS", {})
    seen: list[str] = []
    real = fast_tokens.parse_tokenizer_file
    monkeypatch.setattr(fast_tokens, "parse_tokenizer_file", lambda path: seen.append(path) or real(path))
    return seen


def test_a_cached_conversion_encodes_without_parsing_the_tokenizer_file(trained, tmp_path, monkeypatch, parses):
    """Where the cache holds the file's conversion proven, a job's encoder never parses the file with ``tokenizers``
    (0.15-0.2 s a rank for a 128k vocabulary) unless something the conversion lacks is asked of it."""
    import pyarrow as pa
    from tokenizer_fixtures import column_lists, hf_reference

    from sortpack.inputs.specs import load_tokenizer

    path, texts = trained
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(tmp_path / "cache"))
    load_tokenizer(path)  # the first job: the proof parses the file
    assert parses == [path]
    monkeypatch.setattr(fast_tokens, "_MEMO", {})  # a later job, in a process of its own
    monkeypatch.setattr("sortpack.inputs.specs._TOKENIZERS", {})
    parses.clear()
    enc = load_tokenizer(path)
    assert enc.engine == "tiktoken" and parses == []
    for special in (True, False):
        assert column_lists(enc, texts, special)[0] == hf_reference(path, texts, special)
        assert [list(map(int, ids)) for ids in _split(*enc.encode_texts(texts, special))] == \
            hf_reference(path, texts, special)
    added = next(iter(enc.allowed))
    assert enc.token_to_id(added) is not None and parses == []
    assert enc.encode_column(pa.array(texts)) is not None and parses == []
    vocab = enc.get_vocab_size(with_added_tokens=True)  # the Tokenizer's own: parsed now, once for the file
    assert parses == [path] and vocab == load_tokenizer(path).hf.get_vocab_size(with_added_tokens=True)
    assert enc.token_to_id(added) == enc.hf.token_to_id(added) and parses == [path]


def _split(ids, counts):
    """Return the flat ``ids`` cut into one array per text (``counts``)."""
    import numpy as np

    return np.split(ids, np.cumsum(counts)[:-1])


def test_a_file_that_cannot_be_loaded_still_fails_at_load_as_one_line(tmp_path, monkeypatch, parses):
    from sortpack.errors import SortpackError
    from sortpack.inputs.specs import load_tokenizer

    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "BPE", "vocab": 3}}')
    with pytest.raises(SortpackError, match=r"^--tokenizer .*tokenizer.json: cannot load \("):
        load_tokenizer(str(bad))


def test_a_pairs_job_on_a_cached_conversion_never_parses_and_pickles_what_it_holds(trained, tmp_path, monkeypatch,
                                                                                    parses):
    """A prompt/completion shape loaded with a cached conversion's encoder encodes whole columns unparsed, and a
    pickled copy (a collate's ``tokenize=`` in a DataLoader worker) holds the parsed Tokenizer, its encoder kept."""
    import pickle

    import pyarrow as pa

    from sortpack.inputs.finetune.pairs import PairsShape, prompt_completion
    from sortpack.inputs.row_names import Rows
    from sortpack.inputs.specs import load_tokenizer

    path, texts = trained
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(tmp_path / "cache"))
    load_tokenizer(path)
    monkeypatch.setattr(fast_tokens, "_MEMO", {})
    monkeypatch.setattr("sortpack.inputs.specs._TOKENIZERS", {})
    parses.clear()
    enc = load_tokenizer(path)
    eos = next(iter(enc.allowed))
    shape = PairsShape(prompt_column="p", completion_column="c", encoding="trl", eos_token=eos).loaded(enc)
    assert shape.encoder is enc and parses == []
    table = pa.table({"p": texts, "c": texts[::-1]})
    got = shape.encode_rows(table, Rows("x.jsonl"))
    assert parses == []
    want = prompt_completion(enc.hf, texts, texts[::-1], eos)
    assert _same(got, want)
    copy = pickle.loads(pickle.dumps(shape))
    assert copy.encoder is not None and copy.encoder.handle is copy.tokenizer and copy.tokenizer.parsed
    assert copy == copy and _same(copy.encode_rows(table, Rows("x.jsonl")), want)


def _same(a, b) -> bool:
    """Return whether two ``Encoded`` hold the same ids, labels, sizes and targets."""
    return (a.ids.equals(b.ids) and a.labels.equals(b.labels) and a.sizes.tolist() == b.sizes.tolist()
            and a.targets.tolist() == b.targets.tolist())


# --- a SentencePiece-style file's conversion (the compiled SentencePiece BPE: Mistral's vocabularies) -----------
def _fresh(monkeypatch) -> None:
    """Forget every in-process decision, as a later job's process has none."""
    from sortpack.inputs import sp_conversion, specs

    monkeypatch.setattr(fast_tokens, "_MEMO", {})
    monkeypatch.setattr(sp_conversion, "_MEMO", {})
    monkeypatch.setattr(specs, "_TOKENIZERS", {})


def _same_sp(a, b) -> bool:
    """Return whether two SentencePiece-style conversions hold the same vocabulary, merges, cuts and tokens around."""
    import numpy as np

    va, vb = a.vocab, b.vocab
    return (va.chars == vb.chars and list(va.byte_ids) == list(vb.byte_ids) and np.array_equal(va.merges, vb.merges)
            and (va.bigrams is None) == (vb.bigrams is None) and (va.bigrams is None or np.array_equal(va.bigrams,
                                                                                                     vb.bigrams))
            and (va.replacement, va.prepend) == (vb.replacement, vb.prepend)
            and (a.special, a.prefix, a.suffix, a.after_added, a.plain) == (b.special, b.prefix, b.suffix,
                                                                            b.after_added, b.plain))


def test_a_sentencepiece_conversion_is_read_back_without_parsing_the_file(sentencepiece_vocabularies, tmp_path,
                                                                           monkeypatch, parses):
    import json

    import pyarrow as pa
    from tokenizer_fixtures import column_lists, hf_reference

    from sortpack.inputs import sp_conversion
    from sortpack.inputs.specs import load_tokenizer

    path = sentencepiece_vocabularies("mistral-v3")
    texts = EDGE + ["[INST] hi there [/INST] 😀 naïve</s>", "  two  spaces", "東京 " * 40]
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(tmp_path / "cache"))
    _fresh(monkeypatch)
    first = load_tokenizer(path)  # the first job: converted from the parsed file, kept
    assert first.engine == "compiled" and _entries(tmp_path / "cache") == [
        f"sp-{conversion_cache.entry_key(open(path, 'rb').read())}"]
    _fresh(monkeypatch)
    parses.clear()

    def no_conversion(*_):
        raise AssertionError("converted again although the entry is whole")

    monkeypatch.setattr(sp_conversion, "sp_conversion", no_conversion)
    enc = load_tokenizer(path)
    assert enc.engine == "compiled" and enc.sentencepiece.cached and parses == []
    assert enc.record() == first.record() and _same_sp(enc.sentencepiece, first.sentencepiece)
    plain = [t for t in texts if not any(s in t for s in enc.allowed)]
    for special in (True, False):
        assert column_lists(enc, plain, special)[0] == hf_reference(path, plain, special)
    assert enc.token_to_id("[INST]") == json.load(open(path))["model"]["vocab"]["[INST]"] and parses == []
    assert enc.encode_column(pa.array(texts)) is not None  # the texts holding an added token: tokenizers, parsed now
    assert parses == [path]


@pytest.mark.parametrize("damage", ["truncate", "flip", "other key", "not an entry"])
def test_a_damaged_sentencepiece_entry_is_converted_again_never_read(sentencepiece_vocabularies, tmp_path,
                                                                      monkeypatch, damage):
    from sortpack.inputs.specs import load_tokenizer

    path = sentencepiece_vocabularies("mistral-v1")
    folder = tmp_path / "cache"
    monkeypatch.setenv("SORTPACK_CACHE_DIR", str(folder))
    _fresh(monkeypatch)
    want = load_tokenizer(path)
    entry = folder / _entries(folder)[0]
    data = entry.read_bytes()
    key = entry.name[len("sp-"):]
    entry.write_bytes({"truncate": data[:-7], "flip": data[:-3] + bytes([data[-3] ^ 1]) + data[-2:],
                       "other key": data.replace(key.encode(), b"0" * len(key), 1),
                       "not an entry": b"hello\n" + data}[damage])
    assert conversion_cache.load_sp(key) is None
    _fresh(monkeypatch)
    got = load_tokenizer(path)
    assert got.engine == "compiled" and not got.sentencepiece.cached and _same_sp(got.sentencepiece, want.sentencepiece)
    assert conversion_cache.load_sp(key) is not None  # written anew, whole
