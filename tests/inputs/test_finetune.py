"""The three fine-tuning shapes: ids equal to transformers' chat template, labels masking all but the targets."""
from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("tokenizers")
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from sortpack.errors import SortpackError
from sortpack.inputs.finetune import (
    IGNORE_INDEX,
    encode_chats,
    fine_tune_shape,
    load_chat_template,
    prompt_completion,
    render_chats,
)
from sortpack.inputs.specs import load_tokenizer

from support import LLAMA3_TEMPLATE, conversations, make_chat_tokenizer


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    """A byte-level BPE tokenizer and a ChatML template with {% generation %} blocks (Qwen-like)."""
    return make_chat_tokenizer(tmp_path_factory.mktemp("chatml"))


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """The same tokenizer with a Llama-3-like template (BOS from the config, no generation blocks)."""
    return make_chat_tokenizer(tmp_path_factory.mktemp("llama3"), LLAMA3_TEMPLATE, eos="<|eot_id|>")


def _rows(arr: pa.Array) -> list[list[int]]:
    return arr.to_pylist()


def test_chat_ids_and_assistant_targets_equal_transformers(chatml):
    transformers = pytest.importorskip("transformers")
    tokenizer_file, config = chatml
    hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(config))
    chats = conversations(40)
    enc = encode_chats(load_tokenizer(tokenizer_file), load_chat_template(config), chats)
    for chat, ids, labels in zip(chats, _rows(enc.ids), _rows(enc.labels)):
        want = hf.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        assert ids == list(want["input_ids"])
        mask = np.array(want["assistant_masks"], dtype=bool)
        assert np.array_equal(np.array(labels), np.where(mask, ids, IGNORE_INDEX))
    assert enc.targets.tolist() == [int((np.array(r[1:]) != IGNORE_INDEX).sum()) for r in _rows(enc.labels)]
    assert enc.sizes.tolist() == [len(r) for r in _rows(enc.ids)]


def test_turns_found_prefix_by_prefix_without_generation_blocks(llama3):
    transformers = pytest.importorskip("transformers")
    tokenizer_file, config = llama3
    hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(config))
    tok = load_tokenizer(tokenizer_file)
    template = load_chat_template(config)
    assert not template.has_generation and template.special_tokens["bos_token"] == "<|begin_of_text|>"
    chats = conversations(30, seed=1)
    for roles in (("assistant",), ("user", "assistant")):
        enc = encode_chats(tok, template, chats, roles)
        for chat, ids, labels in zip(chats, _rows(enc.ids), _rows(enc.labels)):
            assert ids == list(hf.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])
            kept = [t for t in labels if t != IGNORE_INDEX]
            # the targets are the chosen turns' contents (trimmed, as the template does), each with its <|eot_id|>
            want = "".join(m["content"].strip() + "<|eot_id|>" for m in chat if m["role"] in roles)
            assert tok.decode(kept, skip_special_tokens=False) == want


def test_jinja_file_takes_the_special_tokens_beside_it(llama3, tmp_path):
    _, config = llama3
    jinja = os.path.join(os.path.dirname(config), "template.jinja")
    with open(jinja, "w") as f:
        f.write(LLAMA3_TEMPLATE)
    text, _ = render_chats(load_chat_template(jinja), [[{"role": "user", "content": "hi"}]])
    assert text == ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"]
    alone = tmp_path / "alone.jinja"
    alone.write_text(LLAMA3_TEMPLATE)
    text, _ = render_chats(load_chat_template(alone), [[{"role": "user", "content": "hi"}]])
    assert text[0].startswith("<|start_header_id|>")  # no config: an undefined bos_token renders empty


def test_bad_templates_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(SortpackError, match="not a Jinja template"):
        load_chat_template(bad)
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text('{"bos_token": "<s>"}')
    with pytest.raises(SortpackError, match="no chat_template"):
        load_chat_template(cfg)
    raising = tmp_path / "raise.jinja"
    raising.write_text("{% for m in messages %}{{ raise_exception('roles must alternate') }}{% endfor %}")
    with pytest.raises(SortpackError, match=r"^messages: row 0: message 0 \(user\): the chat template raise.jinja "
                                            r"cannot render it \(TemplateError: roles must alternate\)$"):
        render_chats(load_chat_template(raising), [[{"role": "user", "content": "x"}]])


def test_prompt_completion_pairs_with_the_post_processors_specials(tmp_path):
    from tokenizers import Tokenizer, processors

    tokenizer_file, _ = make_chat_tokenizer(tmp_path)
    tok = Tokenizer.from_file(tokenizer_file)
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1 <|endoftext|>:1",
        special_tokens=[("<|begin_of_text|>", bos), ("<|endoftext|>", eos)])
    prompts = ["what is two plus two?", "hello", "say nothing", ""]
    completions = [" it is four.", " world, how are you?", "", " fine"]
    enc = prompt_completion(tok, prompts, completions)
    for p, c, ids, labels, targets in zip(prompts, completions, _rows(enc.ids), _rows(enc.labels), enc.targets):
        n_prompt = len(tok.encode(p, add_special_tokens=False).ids)
        n_completion = len(tok.encode(c, add_special_tokens=False).ids)
        assert ids == tok.encode(p, c).ids
        assert ids[0] == bos
        want = [IGNORE_INDEX] * (1 + n_prompt) + (ids[1 + n_prompt:] if n_completion else [IGNORE_INDEX])
        assert labels == want
        assert targets == (n_completion + 1 if n_completion else 0)  # an empty completion trains nothing


def test_labels_column_is_checked_and_counted():
    shape = fine_tune_shape(None, labels_column="labels")
    table = pa.table({"input_ids": [[1, 2, 3], [4, 5], [], [6, 7]], "labels": [[-100, 2, 3], [-100, -100], [], [6, 7]]})
    enc = shape.encode(table, "f.parquet")
    # a first position's label is no target: nothing precedes it (the collates give it -100)
    assert enc.sizes.tolist() == [3, 2, 0, 2] and enc.targets.tolist() == [2, 0, 0, 1]
    bad = pa.table({"input_ids": [[1, 2, 3], [4, 5]], "labels": [[-100, 2, 3], [-100]]})
    with pytest.raises(SortpackError, match=r"f.parquet: column 'labels' has 1 labels in row 1, column "
                                            r"'input_ids' 2 token ids"):
        shape.encode(bad, "f.parquet")
    with pytest.raises(SortpackError, match="no column 'labels'"):
        shape.encode(pa.table({"input_ids": [[1]]}), "f.parquet")
    with pytest.raises(SortpackError, match="not a list of token ids"):
        shape.encode(pa.table({"input_ids": [[1]], "labels": ["x"]}), "f.parquet")


def test_options_choose_one_shape(chatml):
    tokenizer_file, config = chatml
    tok = load_tokenizer(tokenizer_file)
    assert fine_tune_shape(None) is None
    assert fine_tune_shape(None, prompt_column="q", tokenizer=tok).columns() == ["q", "completion"]
    chat = fine_tune_shape(None, chat_template=config, train_on=["user", "assistant"], tokenizer=tok)
    assert chat.name == "chat" and chat.column == "messages" and chat.train_on == ("user", "assistant")
    with pytest.raises(SortpackError, match="name different dataset shapes"):
        fine_tune_shape(None, labels_column="labels", chat_template=config)
    unloaded = fine_tune_shape(None, chat_template=config)  # the options alone: a job loads what they name
    assert unloaded.template is None and unloaded.tokenizer is None
    with pytest.raises(SortpackError, match="needs --tokenizer"):
        unloaded.validate(has_tokenizer=False)
    with pytest.raises(SortpackError, match="--train-on .* needs --chat-template"):
        fine_tune_shape(None, train_on=["assistant"], tokenizer=tok)


def test_shape_is_a_picklable_per_item_tokenize(chatml):
    tokenizer_file, config = chatml
    shape = fine_tune_shape(None, chat_template=config, tokenizer=load_tokenizer(tokenizer_file))
    chat = conversations(1, seed=3)[0]
    ids, labels = pickle.loads(pickle.dumps(shape))({"messages": chat, "other": 1})
    enc = encode_chats(shape.tokenizer, shape.template, [chat])
    assert ids.tolist() == _rows(enc.ids)[0] and labels.tolist() == _rows(enc.labels)[0]


def test_a_wrong_column_type_or_a_null_is_one_line_naming_the_column(chatml):
    tokenizer_file, config = chatml
    tok = load_tokenizer(tokenizer_file)
    pairs = fine_tune_shape(None, prompt_column="q", tokenizer=tok)
    with pytest.raises(SortpackError, match=r"^f\.jsonl: column 'q' is int64, not text$"):
        pairs.encode(pa.table({"q": [1, 2], "completion": ["a", "b"]}), "f.jsonl")
    with pytest.raises(SortpackError, match=r"^f\.jsonl: column 'completion' has 1 null values \(the first in row "
                                            r"1\)$"):
        pairs.encode(pa.table({"q": ["x", "y"], "completion": ["a", None]}), "f.jsonl")
    chat = fine_tune_shape(None, chat_template=config, tokenizer=tok)
    with pytest.raises(SortpackError, match=r"^f\.jsonl: column 'messages' is string, not a list of \{role, content"):
        chat.encode(pa.table({"messages": ["hi"]}), "f.jsonl")


@pytest.mark.parametrize("bad", [-5, 2**40, -101])
def test_a_label_neither_minus_100_nor_a_token_id_is_one_line(bad):
    # it would count as a target and fail only in cross_entropy (or wrap in the int32 store)
    from sortpack.inputs.finetune import Rows

    shape = fine_tune_shape(None, labels_column="labels")
    table = pa.table({"input_ids": [[1, 2, 3], [4, 5, 6]], "labels": [[-100, 2, 3], [-100, bad, 6]]})
    rows = Rows("f.jsonl", 7, lambda row: f"line {row + 1}")
    with pytest.raises(SortpackError, match=rf"^f\.jsonl: line 9: column 'labels' holds {bad} at position 1: a label "
                                            r"is -100 \(no target\) or a token id \(0\.\.2\^31-1\) \(1 such labels\)$"):
        shape.encode(table, rows)


def test_with_a_tokenizer_a_label_past_its_vocabulary_is_refused(chatml):
    tokenizer_file, _ = chatml
    tok = load_tokenizer(tokenizer_file)
    vocab = tok.hf.get_vocab_size(with_added_tokens=True)
    shape = fine_tune_shape(None, labels_column="labels", tokenizer=tok)
    ok = pa.table({"input_ids": [[1, 2]], "labels": [[-100, vocab - 1]]})
    assert shape.encode(ok, "f.parquet").targets.tolist() == [1]
    with pytest.raises(SortpackError, match=rf"holds {vocab} at position 1: a label is -100 \(no target\) or a token "
                                            rf"id of the tokenizer \(0\.\.{vocab - 1}\)"):
        shape.encode(pa.table({"input_ids": [[1, 2]], "labels": [[-100, vocab]]}), "f.parquet")
