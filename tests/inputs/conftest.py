"""Fixtures of the tokenizer-path tests (``tests/tokenizer_fixtures.py``): trained tokenizers and real vocabularies."""
from __future__ import annotations

import pytest
from tokenizer_fixtures import STYLES, real_vocabulary, stdlib_sources, train


@pytest.fixture(scope="module")
def sources() -> list[str]:
    """The first standard-library modules' sources."""
    return stdlib_sources(40)


@pytest.fixture(scope="module")
def tokenizers_by_style(tmp_path_factory, sources) -> dict[str, str]:
    """One tokenizer.json trained per style."""
    pytest.importorskip("tokenizers")
    work = tmp_path_factory.mktemp("fasttok")
    return {s: train(work / f"{s}.json", s, sources) for s in STYLES}


@pytest.fixture(scope="session")
def real_vocabularies(tmp_path_factory):
    """A function: a real vocabulary's tokenizer.json by its name in ``benchmarks.real_vocab.VARIANTS``, written
    once per session; skips the test where openai-whisper (which ships the rank files) is not installed."""
    pytest.importorskip("tokenizers")
    folder = tmp_path_factory.mktemp("real-vocabularies")

    def get(name: str) -> str:
        path = real_vocabulary(name, folder)
        if path is None:
            pytest.skip("openai-whisper is not installed (pip install --no-deps openai-whisper)")
        return path

    return get


@pytest.fixture(scope="session")
def sentencepiece_vocabularies(tmp_path_factory):
    """A function: the tokenizer.json of a Mistral SentencePiece model by its name in
    ``benchmarks.real_vocab.SP_VARIANTS``, written once per session; skips the test where mistral-common's model
    files are not found (``MISTRAL_COMMON_DATA``, or the package installed)."""
    pytest.importorskip("tokenizers")
    from benchmarks.real_vocab import write_sentencepiece

    folder = tmp_path_factory.mktemp("sentencepiece-vocabularies")

    def get(name: str) -> str:
        path = write_sentencepiece(name, folder)
        if path is None:
            pytest.skip("mistral-common's model files not found (.ci/run unpacks them into MISTRAL_COMMON_DATA)")
        return str(path)

    return get
