"""Real chat data: tool calls, content lists, messages without a role, templates that fail or are no templates, roles
no message has; and the targets of a template without {% generation %} blocks where its family has a marked
training template (TRL's)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from benchmarks.real_templates import MISTRAL
from sortpack.errors import SortpackError
from sortpack.inputs.finetune import IGNORE_INDEX, Rows, fine_tune_shape, load_chat_template, render_chats
from sortpack.inputs.finetune.families import FAMILIES, template_digest, turn_rule
from sortpack.inputs.specs import load_tokenizer

from support import CHATML_TEMPLATE, ROOT, conversations, make_chat_tokenizer, read_manifest, run_sortpack

TOOL = {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOL_CHATS = [
    [{"role": "user", "content": "what is two plus two?"}, {"role": "assistant", "content": None, "tool_calls": [TOOL]},
     {"role": "tool", "content": "4"}, {"role": "assistant", "content": "it is four."}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add twice"},
     {"role": "assistant", "content": "fine", "tool_calls": [TOOL, TOOL]}, {"role": "tool", "content": "5"},
     {"role": "tool", "content": "5"}, {"role": "assistant", "content": "five and five"}],
]
MEDIA_CHATS = [
    [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]},
     {"role": "assistant", "content": [{"type": "text", "text": "a quick brown fox"}]}],
    [{"role": "user", "content": [{"type": "text", "text": "hello"}]},
     {"role": "assistant", "content": [{"type": "text", "text": "hello world, how are you?"}]}],
]


def trl_template(name: str) -> str:
    """Return one of the model templates TRL ships (the models' own text: TRL matches them exactly)."""
    trl = pytest.importorskip("trl")
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", f"{name}.jinja"), encoding="utf-8") as f:
        return f.read()


def as_read(chats: list) -> list:
    """Return the chats as an Arrow column gives them (and ``datasets``): a key one message has, the others hold
    as null."""
    return pa.table({"messages": chats}).column("messages").to_pylist()


def with_template(directory, template: str):
    """Return (tokenizer.json, tokenizer_config.json) of the small BPE with ``template`` as its chat template."""
    return make_chat_tokenizer(directory, template, eos="<|im_end|>")


@pytest.mark.parametrize("name,chats", [("qwen2_5", TOOL_CHATS), ("qwen2_5_vl", MEDIA_CHATS)])
def test_tool_calls_and_content_lists_give_apply_chat_template_s_ids(tmp_path, name, chats):
    transformers = pytest.importorskip("transformers")
    tokenizer, config = with_template(tmp_path, trl_template(name))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    read = as_read(chats)
    for roles in (("assistant",), ("user", "assistant")):
        shape = fine_tune_shape(None, chat_template=config, train_on=roles, tokenizer=load_tokenizer(tokenizer))
        enc = shape.encode(pa.table({"messages": chats}), "chats.jsonl")
        for chat, ids, labels in zip(read, enc.ids.to_pylist(), enc.labels.to_pylist()):
            assert ids == list(hf.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])
            assert any(t != IGNORE_INDEX for t in labels)
    assert enc.roles == {"user", "assistant", *(["system", "tool"] if name == "qwen2_5" else [])}


def test_a_tool_call_turn_trains_its_call(tmp_path):
    # an assistant turn with no content is its tool call: the call is the target
    tokenizer, config = with_template(tmp_path, trl_template("qwen2_5"))
    texts, spans = render_chats(load_chat_template(config), as_read(TOOL_CHATS[:1]))
    trained = "".join(texts[0][a:b] for a, b in spans[0])
    assert '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}\n</tool_call><|im_end|>' in trained
    assert "it is four.<|im_end|>" in trained and "what is two plus two?" not in trained


@pytest.mark.parametrize("messages,message", [
    ([{"content": "hi"}, {"role": "assistant", "content": "x"}], r"message 0 has no role \(its keys: content\)"),
    ([{"role": "user", "content": "hi"}, {"role": "", "content": "x"}],
     r"message 1 has role '', not a name \(its keys: content, role\)"),
    (["hi", "there"], r"message 0 is 'hi', not a \{role, content\} object"),
])
def test_a_message_without_a_role_is_one_line_naming_file_row_and_message(tmp_path, messages, message):
    tokenizer, config = make_chat_tokenizer(tmp_path)
    shape = fine_tune_shape(None, chat_template=config, tokenizer=load_tokenizer(tokenizer))
    chats = [[{"role": "user", "content": "ok"}]] * 3 + [messages]
    rows = Rows("chats.jsonl", 10, lambda row: f"line {row + 1}")
    with pytest.raises(SortpackError, match=rf"^chats\.jsonl: line 14: {message}$"):
        shape.encode(pa.Table.from_pylist([{"messages": c} for c in chats]) if isinstance(messages[0], dict)
                     else pa.table({"messages": pa.array([[], [], [], messages])}), rows)


@pytest.mark.parametrize("source,why", [
    ("{% for m in messages %}{{ 1 / 0 }}{% endfor %}", r"ZeroDivisionError: division by zero"),
    ("{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}", r"TypeError: "),
    ("{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no assistant') }}{% endif %}"
     "{{ m.content }}{% endfor %}", r"TemplateError: no assistant"),
])
def test_a_template_that_fails_on_a_chat_is_one_line(tmp_path, source, why):
    template = tmp_path / "t.jinja"
    template.write_text(source)
    chats = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "there"}]]
    expected = "message 1 \\(assistant\\)" if "assistant'" in source else "message 0 \\(user\\)"
    with pytest.raises(SortpackError, match=rf"^c\.jsonl: row 0: {expected}: the chat template t\.jinja cannot "
                                            rf"render it \({why}"):
        render_chats(load_chat_template(template), chats, where="c.jsonl")


def test_a_null_content_the_template_cannot_take_names_the_message(tmp_path):
    # ChatML-like templates read the content: an assistant's tool call (no content: the key is dropped, as
    # apply_chat_template drops it) fails there, in one line
    _, config = make_chat_tokenizer(tmp_path)
    chats = as_read(TOOL_CHATS[:1])
    with pytest.raises(SortpackError, match=r"^c\.jsonl: row 0: message 1 \(assistant\): the chat template "
                                            r"tokenizer_config\.json cannot render it \(UndefinedError: 'dict object' "
                                            r"has no attribute 'content'\)$"):
        render_chats(load_chat_template(config), chats, where="c.jsonl")


@pytest.mark.parametrize("name,text,why", [
    ("t.yaml", "chat_template: |\n  {% for m in messages %}{{ m.content }}{% endfor %}\n", "a YAML file"),
    ("template", "chat_template: |\n  {% for m in messages %}{{ m.content }}{% endfor %}\n", "a YAML file"),
    ("t.txt", "hello {{ name }}\n", "never reads messages"),
    ("t.jinja", "{% include 'header.jinja' %}{% for m in messages %}{{ m.content }}{% endfor %}",
     r"line 1 uses \{% include %\}"),
    ("t.jinja", "{% import 'macros.jinja' as m %}{% for x in messages %}{{ x.content }}{% endfor %}",
     r"uses \{% import %\}"),
    ("t.jinja", "{% extends 'base.jinja' %}{% block b %}{{ messages }}{% endblock %}", r"uses \{% extends %\}"),
])
def test_a_file_that_is_no_chat_template_is_refused(tmp_path, name, text, why):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SortpackError, match=rf"^--chat-template \S*{name}: .*{why}"):
        load_chat_template(path)


def test_a_template_file_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_bytes(b"{% for m in messages %}\xff{{ m.content }}{% endfor %}")
    with pytest.raises(SortpackError, match=r"not UTF-8 text \(byte 0xff at offset 23\)"):
        load_chat_template(path)


def test_a_template_is_checked_and_compiled_once_a_process(tmp_path):
    # a job loads its template in several places: the text is parsed and compiled once, and the error of a bad one
    # comes every time
    path = tmp_path / "once.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}")
    first, again = load_chat_template(path), load_chat_template(path)
    assert first._template() is again._template()
    assert render_chats(again, [[{"role": "user", "content": "hi"}]])[0] == ["[user] hi"]
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}")
    for _ in range(2):
        with pytest.raises(SortpackError, match=r"^--chat-template bad.jinja: not a Jinja template \(No filter named "
                                                r"'no_such_filter'"):
            load_chat_template(bad)


@pytest.mark.parametrize("family", ["llama3", "qwen2_5"])
def test_a_known_family_s_template_loads_without_jinja(tmp_path, family):
    # its conversations are laid out without Jinja: loading it neither imports nor compiles Jinja (0.1 s a rank of
    # a small job), and a conversation left to Jinja still renders it
    import subprocess
    import sys

    trl = pytest.importorskip("trl")
    source = (Path(trl.__file__).parent / "chat_templates" / f"{family}.jinja").read_text(encoding="utf-8")
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": source, "bos_token": "<s>", "eos_token": "</s>"}))
    assert turn_rule(source)[0] == family
    probe = ("import sys; from sortpack.inputs.finetune import load_chat_template as load; "
             f"t = load({str(path)!r}); assert 'jinja2' not in sys.modules, 'jinja2 imported'; print(t.name)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() == "tokenizer_config.json", proc.stderr
    texts, _ = render_chats(load_chat_template(path), [[{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "yo"}]])
    assert "hi" in texts[0] and "yo" in texts[0]


def test_roles_no_message_has_are_refused_naming_the_roles_seen(tmp_path):
    tokenizer, config = make_chat_tokenizer(tmp_path)
    for roles in (("ASSISTANT",), ("robot",), ("user;assistant",)):
        shape = fine_tune_shape(None, chat_template=config, train_on=roles, tokenizer=load_tokenizer(tokenizer))
        enc = shape.encode(pa.table({"messages": conversations(20)}), "c.jsonl")
        with pytest.raises(SortpackError, match=rf"^--train-on {roles[0]}: no message has that role \(the roles the "
                                                r"messages hold: assistant, system, user\)$"):
            shape.check_roles(enc.roles)


@pytest.mark.parametrize("family", sorted(name for name, _ in FAMILIES.values() if name not in MISTRAL))
def test_a_family_s_targets_follow_its_marked_training_template(family):
    # TRL's <family>.jinja is the model's own template (the digest the table keys) and <family>_training.jinja marks
    # what TRL trains: rendered prefix by prefix, the family's rule gives those very characters
    from sortpack.inputs.finetune.template import ChatTemplate

    source = trl_template(family)
    assert turn_rule(source)[0] == family and FAMILIES[template_digest(source)][0] == family
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    ours, marked = ChatTemplate(source, special, family), ChatTemplate(trl_template(f"{family}_training"), special)
    chats = conversations(30, seed=4)
    got_texts, got = render_chats(ours, chats)
    for chat, text, spans in zip(chats, got_texts, got):
        want_text, want = marked.render(chat)
        assert text == want_text and spans == [s for s in want if s[1] > s[0]]


def test_qwen2_5_labels_equal_trl_s_training_template_with_tool_calls(tmp_path):
    # Qwen 2.5's own template has no {% generation %} marks; TRL trains it with qwen2_5_training, whose marks hold
    # the "\n" before each answer and the one after <|im_end|>: the labels are the assistant masks of that template
    transformers = pytest.importorskip("transformers")
    tokenizer, config = with_template(tmp_path, trl_template("qwen2_5"))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    chats = [*TOOL_CHATS, *conversations(20, seed=2)]
    shape = fine_tune_shape(None, chat_template=config, tokenizer=load_tokenizer(tokenizer))
    enc = shape.encode(pa.table({"messages": as_read(chats)}), "c.jsonl")
    for chat, ids, labels in zip(as_read(chats), enc.ids.to_pylist(), enc.labels.to_pylist()):
        want = hf.apply_chat_template(chat, chat_template=trl_template("qwen2_5_training"), tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True)
        assert ids == list(want["input_ids"])
        assert labels == np.where(np.array(want["assistant_masks"], bool), ids, IGNORE_INDEX).tolist()


def _write(path, chats):
    with open(path, "w") as f:
        for chat in chats:
            f.write(json.dumps({"messages": chat}) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("case,line", [
    ("no role", "chats.jsonl: line 8: message 0 has no role (its keys: content)"),
    ("tool call", "chats.jsonl: line 4: message 1 (assistant): the chat template tokenizer_config.json cannot render "
                  "it (UndefinedError: "),
    ("strings", "chats.jsonl: line 1: message 0 is 'hi', not a {role, content} object"),
])
def test_a_job_over_bad_chats_exits_2_with_one_line(tmp_path, case, line):
    tokenizer, config = make_chat_tokenizer(tmp_path / "tok")
    chats = conversations(12)
    if case == "no role":
        chats[7] = [{"content": "hi"}, {"role": "assistant", "content": "x"}]
    elif case == "tool call":
        chats[3] = TOOL_CHATS[0]
    else:
        chats = [["hi", "there"]] * 3
    _write(tmp_path / "chats.jsonl", chats)
    proc = run_sortpack(["run", tmp_path / "chats.jsonl", "-o", tmp_path / "plan", "--chat-template", config,
                         "--tokenizer", tokenizer, "--rows", "512", "--quiet"], ranks=2, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.strip().splitlines() if x.startswith("Error:") or "chats.jsonl" in x]
    assert len(lines) == 1 and line in lines[0] and str(tmp_path) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["chats.jsonl", "tok"]


@pytest.mark.slow
def test_a_job_training_on_a_role_no_message_has_exits_2_before_writing(tmp_path):
    tokenizer, config = make_chat_tokenizer(tmp_path / "tok")
    _write(tmp_path / "chats.jsonl", conversations(30))
    proc = run_sortpack(["run", tmp_path / "chats.jsonl", "-o", tmp_path / "plan", "--chat-template", config,
                         "--tokenizer", tokenizer, "--rows", "512", "--train-on", "ASSISTANT", "--quiet"], check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "Error: --train-on ASSISTANT: no message has that role (the roles the messages hold: assistant, system, "
        "user)"], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.jsonl", "tok"]


@pytest.mark.slow
def test_a_template_changed_under_its_name_is_blamed_not_the_input(tmp_path):
    tokenizer, config = make_chat_tokenizer(tmp_path / "tok")
    _write(tmp_path / "chats.jsonl", [c * 4 for c in conversations(40)])
    args = ["--chat-template", config, "--tokenizer", tokenizer, "--max-tokens", "160", "--oversize", "split",
            "--store-tokens", "--quiet"]
    run_sortpack(["run", tmp_path / "chats.jsonl", "-o", tmp_path / "run", *args, "--keep-intermediate"])
    assert len(read_manifest(tmp_path / "run")["options"]["fine_tune"]["template_sha256"]) == 64
    cfg = json.loads(open(config).read())
    cfg["chat_template"] = CHATML_TEMPLATE.replace("'\\n'", "'\\n\\n'")
    with open(config, "w") as f:
        json.dump(cfg, f)
    proc = run_sortpack(["pack", tmp_path / "run.sorted", "-o", tmp_path / "again", *args], check=False)
    assert proc.returncode == 2 and "--chat-template" in proc.stderr and "not the template the plan's chats were " \
        "rendered with (its text or special tokens changed since" in proc.stderr, proc.stderr
    assert "the input changed" not in proc.stderr


def test_a_row_is_named_only_in_an_error_line(tmp_path):
    # naming a JSONL row reads the file to its line: done for every chat it made analyze quadratic
    tokenizer, config = make_chat_tokenizer(tmp_path)
    shape = fine_tune_shape(None, chat_template=config, tokenizer=load_tokenizer(tokenizer))
    named = []
    rows = Rows("c.jsonl", 0, lambda row: named.append(row) or f"line {row + 1}")
    shape.encode(pa.table({"messages": conversations(50)}), rows)
    assert named == []
    with pytest.raises(SortpackError, match=r"^c\.jsonl: line 51: message 0 has no role"):
        shape.encode(pa.Table.from_pylist([{"messages": c} for c in [*conversations(50), [{"content": "x"}]]]), rows)
    assert named == [50]
