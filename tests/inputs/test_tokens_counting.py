"""``--size tokens`` counts what the tokenizer produces, not its truncation or padding."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sortpack.inputs.specs import evaluate, load_tokenizer, parse_spec

from support import run_sortpack

pytest.importorskip("tokenizers")


def model_tokenizer(path, kind: str = "wordlevel", length: int = 8) -> str:
    """Save a tokenizer.json like a model's: [CLS]/[SEP] added, truncated and padded to ``length``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    if kind == "wordlevel":
        tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"])
    else:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hi there word", "word word hi"], trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls),
                                                                                              ("[SEP]", sep)])
    tok.enable_truncation(max_length=length)
    tok.enable_padding(length=length, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    tok.save(str(path))
    return str(path)


@pytest.mark.parametrize("kind", ["wordlevel", "wordpiece"])
def test_truncation_and_padding_of_the_file_are_ignored(tmp_path, kind):
    tok = load_tokenizer(model_tokenizer(tmp_path / "tokenizer.json", kind))
    texts = pa.table({"text": ["hi", "word " * 1000, "hi there"]})
    spec = parse_spec("tokens", "text", "--size")
    assert evaluate(spec, texts, "x", tokenizer=tok).tolist() == [3, 1002, 4]
    assert evaluate(spec, texts, "x", tokenizer=tok, special_tokens=False).tolist() == [1, 1000, 2]


@pytest.mark.slow
def test_cli_special_tokens_option_is_counted_and_recorded(tmp_path):
    tok = model_tokenizer(tmp_path / "tokenizer.json")
    pq.write_table(pa.table({"text": ["hi", "word " * 1000, "hi there"]}), tmp_path / "in.parquet")
    sizes = {}
    for flag in ("--special-tokens", "--no-special-tokens"):
        out = tmp_path / flag.strip("-")
        run_sortpack(["analyze", tmp_path / "in.parquet", "-o", out, "--size", "tokens", "--tokenizer", tok,
                      flag, "--quiet"])
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["options"]["special_tokens"] is (flag == "--special-tokens")
        table = pa.ipc.open_file(str(out / "metrics-00000.arrow")).read_all()
        sizes[flag] = table.column("size").to_pylist()
    assert sizes == {"--special-tokens": [3, 1002, 4], "--no-special-tokens": [1, 1000, 2]}
    plan = tmp_path / "plan"
    done = run_sortpack(["run", tmp_path / "in.parquet", "-o", plan, "--size", "tokens", "--tokenizer", tok,
                         "--max-tokens", "2000"])
    assert "padding 0.00%" not in done.stdout
    assert json.loads((plan / "manifest.json").read_text())["options"]["special_tokens"] is True
