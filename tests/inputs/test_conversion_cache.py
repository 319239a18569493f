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
    """Return ``fast_tokens._convert`` of ``path`` as a fresh process would (no in-process memo)."""
    from tokenizers import Tokenizer

    return fast_tokens._convert(path, Tokenizer.from_file(path))


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
