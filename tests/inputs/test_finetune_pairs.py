"""Prompt/completion pairs train what TRL trains: prompt + completion + eos as one text, the completion and its end
token the targets, on real-ish vocabularies (a Llama-3-like pair template, a Qwen-like one without, a BERT-like one
whose post-processor closes every text)."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("tokenizers")

from sortpack.errors import SortpackError
from sortpack.inputs.finetune import IGNORE_INDEX, fine_tune_shape, prompt_completion
from sortpack.inputs.specs import load_tokenizer

from support import LLAMA3_TEMPLATE, make_chat_tokenizer, read_manifest, run_sortpack

PAIRS = [("what is two plus two?", " it is four."), ("hello", ""), ("the quick bro", "wn fox jumps"),
         ("fine thanks! ", "how are you?<|eot_id|>"), ("", " the lazy dog"), ("\u00fcn\u00efcode \U0001f98a", " fox")]


def _llama3(directory):
    """A byte-level BPE with Llama 3's post-processor: BOS before one text, and before each text of a pair."""
    from tokenizers import Tokenizer, processors

    tokenizer, config = make_chat_tokenizer(directory, LLAMA3_TEMPLATE, eos="<|eot_id|>")
    tok = Tokenizer.from_file(tokenizer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
        special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(tokenizer)
    return tokenizer


def _bert(directory):
    """A word-level tokenizer whose post-processor puts [CLS] before and [SEP] after every text, [SEP] its eos."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = " ".join(p + " " + c for p, c in PAIRS)
    tok.train_from_iterator([words], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "[SEP]", "pad_token": "[PAD]",
        "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]", "model_max_length": 1 << 20}))
    return str(directory / "tokenizer.json")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Three tokenizer.json files with a tokenizer_config.json beside each (its eos_token)."""
    base = tmp_path_factory.mktemp("pairs")
    return {"llama3": _llama3(base / "llama3"), "qwen": make_chat_tokenizer(base / "qwen")[0],
            "bert": _bert(base / "bert")}


def _ours(tokenizer: str, pairs) -> list[tuple[list, list]]:
    from sortpack.inputs.finetune import end_token

    shape = fine_tune_shape(None, prompt_column="prompt", tokenizer=load_tokenizer(tokenizer),
                            eos_token=end_token(tokenizer, None))
    enc = shape.encode(pa.table({"prompt": [p for p, _ in pairs], "completion": [c for _, c in pairs]}), "p.jsonl")
    return list(zip(enc.ids.to_pylist(), enc.labels.to_pylist()))


@pytest.mark.parametrize("name", ["llama3", "qwen", "bert"])
def test_pairs_are_one_text_with_the_end_token_a_target(tokenizers, name):
    # transformers' tokenizer of the same directory is the oracle of the ids; the completion starts where the
    # prompt's own ids stop agreeing with the whole text's (a token merged across the boundary is the completion's)
    transformers = pytest.importorskip("transformers")
    import os

    hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(tokenizers[name]))
    pairs = [(p, c.replace("<|eot_id|>", hf.eos_token)) for p, c in PAIRS] if name != "bert" else \
        [(p, c.replace("<|eot_id|>", "")) for p, c in PAIRS]
    for (prompt, completion), (ids, labels) in zip(pairs, _ours(tokenizers[name], pairs)):
        text = prompt + (completion if completion.endswith(hf.eos_token) else completion + hf.eos_token)
        assert ids == hf(text)["input_ids"]
        alone = hf(prompt)["input_ids"]
        start = next((i for i, (a, b) in enumerate(zip(alone, ids)) if a != b), min(len(alone), len(ids)))
        assert labels == [IGNORE_INDEX] * start + ids[start:]
        assert hf.eos_token_id in [t for t in labels if t != IGNORE_INDEX]  # the model learns to stop
        if name == "llama3":  # one BOS, in front: none between prompt and completion
            assert ids.count(hf.bos_token_id) == 1 and ids[0] == hf.bos_token_id


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3", "qwen", "bert"])
def test_pairs_equal_trl_sft_trainers_own_tokenization(tokenizers, name, tmp_path):
    # TRL 1.16's SFTTrainer prepares the same pairs (completion_only_loss): its input_ids and labels are ours
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    import os

    import transformers
    from trl import SFTConfig, SFTTrainer

    hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(tokenizers[name]))
    pairs = [(p, c.replace("<|eot_id|>", hf.eos_token if name != "bert" else "")) for p, c in PAIRS]
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(hf), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2))
    trainer = SFTTrainer(model=model, processing_class=hf, train_dataset=datasets.Dataset.from_list(
        [{"prompt": p, "completion": c} for p, c in pairs]), args=SFTConfig(
        output_dir=str(tmp_path), report_to=[], max_length=None, bf16=False, use_cpu=True))
    want = [(row["input_ids"], row["labels"]) for row in trainer.train_dataset]
    assert _ours(tokenizers[name], pairs) == want


def test_the_pair_template_is_an_explicit_option(tokenizers):
    # --pair-encoding pair: the tokenizer's pair template, the completion from its first token on, no end token
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizers["llama3"])
    bos = tok.token_to_id("<|begin_of_text|>")
    enc = prompt_completion(tok, ["what is two plus two?", "hello"], [" it is four.", ""])
    ids, labels = enc.ids.to_pylist(), enc.labels.to_pylist()
    assert ids[0] == tok.encode("what is two plus two?", " it is four.").ids and ids[0].count(bos) == 2
    n = len(tok.encode("what is two plus two?", add_special_tokens=False).ids) + 2  # the BOS of each text
    assert labels[0] == [IGNORE_INDEX] * n + ids[0][n:] and enc.targets.tolist()[1] == 0


def test_the_end_token_comes_from_the_config_or_the_option(tokenizers, tmp_path):
    from sortpack.inputs.finetune import end_token
    from sortpack.inputs.finetune.pairs import check_end_token

    assert end_token(tokenizers["llama3"], None) == "<|eot_id|>"
    assert end_token(tokenizers["llama3"], "<|endoftext|>") == "<|endoftext|>"
    alone = tmp_path / "alone" / "tokenizer.json"
    alone.parent.mkdir()
    alone.write_bytes(open(tokenizers["qwen"], "rb").read())
    with pytest.raises(SortpackError, match=r"end-of-sequence token .* is unknown .*give --eos-token TOKEN"):
        end_token(str(alone), None)
    with pytest.raises(SortpackError, match=r"--eos-token </s>: not a token of the tokenizer"):
        check_end_token(load_tokenizer(tokenizers["qwen"]).hf, "</s>")


def test_a_null_prompt_names_its_row(tokenizers):
    shape = fine_tune_shape(None, prompt_column="prompt", tokenizer=load_tokenizer(tokenizers["qwen"]),
                            eos_token="<|im_end|>")
    from sortpack.inputs.finetune import Rows

    rows = Rows("p.jsonl", 40, lambda row: f"line {row + 2}")
    with pytest.raises(SortpackError, match=r"^p\.jsonl: column 'prompt' has 2 null values \(the first in line 43\)$"):
        shape.encode(pa.table({"prompt": ["a", None, None], "completion": ["b", "c", "d"]}), rows)


@pytest.mark.slow
def test_run_records_the_encoding_and_pack_encodes_the_same_again(tokenizers, tmp_path):
    rng = np.random.default_rng(3)
    words = "the quick brown fox jumps over lazy dog hello world".split()
    with open(tmp_path / "pairs.jsonl", "w") as f:
        for _ in range(120):
            f.write(json.dumps({"prompt": " ".join(rng.choice(words, int(rng.integers(1, 30)))),
                                "completion": " " + " ".join(rng.choice(words, int(rng.integers(0, 60))))}) + "\n")
    args = ["--prompt-column", "prompt", "--tokenizer", tokenizers["llama3"], "--max-tokens", "48",
            "--oversize", "split", "--store-tokens", "--quiet"]
    run_sortpack(["run", tmp_path / "pairs.jsonl", "-o", tmp_path / "run", *args, "--keep-intermediate"])
    record = read_manifest(tmp_path / "run")["options"]["fine_tune"]
    assert record["encoding"] == "trl" and record["eos_token"] == "<|eot_id|>" and len(record["tokenizer_sha256"]) == 64
    run_sortpack(["sort", tmp_path / "run.metrics", "-o", tmp_path / "s", "--quiet"])
    run_sortpack(["pack", tmp_path / "s", "-o", tmp_path / "p", *args[4:], "--tokenizer", tokenizers["llama3"]])
    assert read_manifest(tmp_path / "p")["content_hash"] == read_manifest(tmp_path / "run")["content_hash"]
    # the old convention, asked for: no end token, the pair template's second BOS
    run_sortpack(["run", tmp_path / "pairs.jsonl", "-o", tmp_path / "pair", *args, "--pair-encoding", "pair"])
    assert read_manifest(tmp_path / "pair")["options"]["fine_tune"]["encoding"] == "pair"
    bad = run_sortpack(["run", tmp_path / "pairs.jsonl", "-o", tmp_path / "x", *args, "--pair-encoding", "pair",
                        "--eos-token", "<|eot_id|>"], check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "Error: --eos-token with --pair-encoding pair: the pair template places the special tokens (leave "
        "--eos-token out, or use --pair-encoding trl)"]
