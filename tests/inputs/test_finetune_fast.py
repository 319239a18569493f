"""Chats of a known family rendered and encoded without Jinja (``finetune.fast_render``, ``fast_chats``): the same
texts, ids and labels as the Jinja path on any conversation (the oracle), the fallback for what the pattern does
not cover, and the path in the plan's provenance."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sortpack.errors import SortpackError  # noqa: E402
from sortpack.inputs.finetune import ChatShape, load_chat_template, render_chats  # noqa: E402
from sortpack.inputs.finetune.chats import encode_chats  # noqa: E402
from sortpack.inputs.finetune.fast_chats import encode_layout  # noqa: E402
from sortpack.inputs.finetune.fast_render import fast_family, render_column, render_layout  # noqa: E402
from sortpack.inputs.specs import load_tokenizer  # noqa: E402

from support import make_chat_tokenizer, modules_loaded_by, read_manifest, run_sortpack  # noqa: E402

FAMILIES = ["llama3", "qwen2_5"]
# what a content may hold: words, Unicode (Python's whitespace that Arrow's is not among it), the family's special
# tokens' texts, the marker's first character, a role's header
PIECES = ["hello", " world", "naïve", "東京", "😀", " ", "\n", "\t", "\x1c", "\x85", "\u3000", "\u2028", "<|eot_id|>",
          "<|im_end|>", "<|im_start|>", "<|start_header_id|>", "\ue000", "assistant\n", "'s", "123", "..."]
ROLES = ["system", "user", "assistant", "tool", "moderator", "user "]


def trl_template(name: str) -> str:
    """Return a model's own chat template as TRL ships it (its digest is the family's)."""
    trl = pytest.importorskip("trl")
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", f"{name}.jinja"), encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict:
    """Return family -> (tokenizer.json, tokenizer_config.json): the small chat BPE with the family's own template."""
    out = {}
    for family in FAMILIES:
        folder = tmp_path_factory.mktemp(family)
        out[family] = make_chat_tokenizer(folder, trl_template(family), eos="<|eot_id|>")
    return out


def _shape(files: tuple[str, str], train_on: tuple[str, ...]) -> ChatShape:
    return ChatShape(chat_template=files[1], train_on=train_on).loaded(load_tokenizer(files[0], "--tokenizer"))


def _both(shape: ChatShape, chats: list) -> tuple:
    """Return (the job's encoding, the Jinja path's), each an Encoded or the SortpackError it raised."""
    table = pa.table({"messages": chats})

    def attempt(fn):
        try:
            return fn()
        except SortpackError as exc:
            return str(exc)

    fast = attempt(lambda: shape.encode(table, "chats.jsonl"))
    slow = attempt(lambda: encode_chats(shape.tokenizer, shape.template, table.column("messages").to_pylist(),
                                        shape.train_on, "chats.jsonl"))
    return fast, slow


def _assert_same(fast, slow) -> None:
    if isinstance(slow, str) or isinstance(fast, str):
        assert fast == slow
        return
    assert fast.ids.equals(slow.ids) and fast.labels.equals(slow.labels)
    assert fast.sizes.tolist() == slow.sizes.tolist() and fast.targets.tolist() == slow.targets.tolist()
    assert fast.roles == slow.roles


message = st.fixed_dictionaries({"role": st.sampled_from(ROLES),
                                 "content": st.lists(st.sampled_from(PIECES), max_size=6).map("".join)})
odd = st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": st.none() | st.just("x"),
                             "tool_calls": st.none() | st.just([{"function": {"name": "f", "arguments": "{}"}}])})
conversation = st.lists(st.one_of(message, message, message, odd), min_size=1, max_size=6)


@pytest.mark.parametrize("family", FAMILIES)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chats=st.lists(conversation, min_size=1, max_size=6), train_on=st.sampled_from(
    [("assistant",), ("user", "assistant"), ("system",), ("moderator", "assistant")]))
def test_the_pattern_gives_the_jinja_path_s_ids_and_labels(families, family, chats, train_on):
    shape = _shape(families[family], train_on)
    laid = render_layout(shape.template, pa.array(chats))
    if any(isinstance(m["content"], str) for chat in chats for m in chat):  # else Arrow types the contents null
        assert laid is not None and encode_layout(shape.encoder, laid[1], frozenset(train_on)) is not None
    _assert_same(*_both(shape, chats))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_pattern_renders_jinja_s_text(families, family):
    template = load_chat_template(families[family][1])
    chats = [[{"role": "system", "content": " be brief \n"}, {"role": "user", "content": "hi\u3000"},
              {"role": "assistant", "content": "\x1chello<|eot_id|> there"}],
             [{"role": "user", "content": ""}, {"role": "assistant", "content": "東京 😀"}],
             [{"role": "tool", "content": "4"}]]
    ok, texts = render_column(template, pa.array(chats))
    jinja, _ = render_chats(template, [c for c, good in zip(chats, ok) if good])
    assert texts.to_pylist() == jinja
    assert ok.tolist() == [True, True, family == "llama3"]  # Qwen 2.5 renders a tool's turn its own way


@pytest.mark.parametrize("family", FAMILIES)
def test_batches_put_every_conversation_back_in_its_place_and_name_its_row(families, family, monkeypatch):
    from sortpack.inputs.finetune import fast_chats

    monkeypatch.setattr(fast_chats, "BATCH", 2)
    shape = _shape(families[family], ("assistant",))
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    tool = [{"role": "user", "content": "add"}, {"role": "assistant", "content": None,
                                                 "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]
    chats = [good, tool, good[:1], tool, good, good]
    _assert_same(*_both(shape, chats))
    nameless = [good, good, good, [{"content": "no role"}], good]  # the error of row 3, in the second batch
    fast, slow = _both(shape, nameless)
    assert isinstance(fast, str) and fast == slow and "row 3" in fast


def test_an_unknown_template_or_a_tokenizer_without_its_tokens_takes_jinja(tmp_path, families):
    files = make_chat_tokenizer(tmp_path / "chatml")  # support's ChatML: no family's own template
    shape = _shape(files, ("assistant",))
    assert fast_family(shape.template) is None
    chats = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]]
    _assert_same(*_both(shape, chats))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_s_chats_and_pairs_job_loads_no_pyarrow_compute(tmp_path, families, family):
    # importing pyarrow.compute makes a Python wrapper for each of ~290 functions (about 30 ms of CPU a rank of every
    # job): the pattern's layout, its encoding and the pairs call Arrow's functions through sortpack.arrow_compute
    tok, config = families[family]
    chats, pairs = tmp_path / "chats.jsonl", tmp_path / "pairs.jsonl"
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi \u6771\u4eac"},
             {"role": "assistant", "content": " hello there ", "tool_calls": None}]  # a field the pattern checks
    chats.write_text("".join(json.dumps({"messages": turns[k % 2:]}) + "\n" for k in range(40)), encoding="utf-8")
    pairs.write_text("".join(json.dumps({"prompt": f"q{k} ", "completion": "a b"}) + "\n" for k in range(40)))
    for name, shape in (("chats", ["--chat-template", config]),
                        ("pairs", ["--prompt-column", "prompt", "--completion-column", "completion"])):
        out = tmp_path / f"{name}-plan"
        loaded = modules_loaded_by(["run", tmp_path / f"{name}.jsonl", "-o", out, *shape, "--tokenizer", tok,
                                    "--rows", "256", "--store-tokens", "--quiet"])
        assert read_manifest(out)["num_samples"] == 40
        assert "pyarrow.compute" not in loaded, name
    assert read_manifest(tmp_path / "chats-plan")["provenance"]["chat_render"] == {
        "tokenizer_config.json": {"render": "pattern", "family": family}}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_real_vocabulary_gives_the_same_ids_and_the_plan_records_the_path(tmp_path, family):
    from benchmarks import sft_data

    got = sft_data.real_tokenizer(family, tmp_path / "tok")
    if got is None:
        pytest.skip("needs openai-whisper (pip install --no-deps openai-whisper) and trl")
    tok, config = map(str, got)
    chats = sft_data.make_chats(tmp_path / "chats", 120, files=2)
    rows = [json.loads(line) for path in chats for line in open(path, encoding="utf-8")]
    shape = _shape((tok, config), ("assistant",))
    _assert_same(*_both(shape, [r["messages"] for r in rows]))
    out = tmp_path / "plan"
    run_sortpack(["run", *map(str, chats), "-o", str(out), "--chat-template", config, "--tokenizer", tok, "--rows",
                  "4096", "--store-tokens"], ranks=2)
    assert read_manifest(out)["provenance"]["chat_render"] == {"tokenizer_config.json": {
        "render": "pattern", "family": family}}


# --- Mistral's own templates through a SentencePiece-style file's compiled BPE ----------------------------------------
# each family with the vocabulary it ships with, and with the others' shapes: [INST] plain text (v0.1's) or a control
# token (v0.3's); the Prepend normalizer (a phantom replacement before every text after an added token), Metaspace
# "first" (none) or Metaspace "always" (where the text does not start with a space)
MISTRAL_CASES = [("mistral_v0_1", "mistral-v1"), ("mixtral", "mistral-v1"), ("mistral_v0_2", "mistral-v1"),
                 ("mistral_v0_3", "mistral-v3"), ("mistral_v0_3", "mistral-v3-metaspace"),
                 ("mistral_v0_2", "mistral-v3-metaspace"), ("mixtral", "mistral-v3"),
                 ("mistral_v0_2", "mistral-v3-metaspace-always")]
MISTRAL_PIECES = ["hello", " world", "naïve", "東京", "😀", " ", "  ", "\n", "\t", "\x85", "\u3000", "</s>", "<s>",
                  "[INST]", "[/INST]", "[control_8]", "\u2581", "\ue000", "'s", "123", "[", "]", "<", "/s>"]


@pytest.fixture(scope="module")
def mistral_files(tmp_path_factory, sentencepiece_vocabularies):
    """A function: (tokenizer.json, tokenizer_config.json) of a Mistral family's own template on a vocabulary."""
    from benchmarks.real_templates import mistral_templates

    templates = mistral_templates()
    if templates is None:
        pytest.skip("Mistral's templates not found (.ci/run unpacks them into CHAT_TEMPLATES_DATA)")
    folder = tmp_path_factory.mktemp("mistral")

    def get(family: str, vocab: str) -> tuple[str, str]:
        config = folder / f"{family}-{vocab}" / "tokenizer_config.json"
        if not config.is_file():
            config.parent.mkdir()
            config.write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": templates[family]}))
        return sentencepiece_vocabularies(vocab), str(config)

    return get


@st.composite
def mistral_chat(draw) -> list:
    """A conversation as Mistral's templates take it (now and then a system turn or a role they refuse)."""
    content = st.lists(st.sampled_from(MISTRAL_PIECES), max_size=6).map("".join)
    chat = [{"role": "user" if k % 2 == 0 else "assistant", "content": draw(content)}
            for k in range(draw(st.integers(1, 6)))]
    if draw(st.integers(0, 3)) == 0:
        chat.insert(0, {"role": "system", "content": draw(content)})
    if draw(st.integers(0, 11)) == 0:
        k = draw(st.integers(0, len(chat) - 1))
        chat[k] = {**chat[k], "role": draw(st.sampled_from(ROLES))}
    return chat


@pytest.mark.parametrize("family,vocab", MISTRAL_CASES)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None)
@given(chats=st.lists(mistral_chat(), min_size=1, max_size=6), train_on=st.sampled_from(
    [("assistant",), ("user", "assistant"), ("system",), ("user",)]))
def test_mistral_s_templates_give_the_jinja_path_s_ids_and_labels(mistral_files, family, vocab, chats, train_on):
    shape = _shape(mistral_files(family, vocab), train_on)
    assert shape.encoder.engine == "compiled" and fast_family(shape.template).name == family
    _assert_same(*_both(shape, chats))


@pytest.mark.parametrize("family,vocab", MISTRAL_CASES[:5])
def test_mistral_s_chats_take_the_pattern_and_the_kernel(mistral_files, family, vocab):
    from sortpack.inputs.fast_tokens import RENDERED

    shape = _shape(mistral_files(family, vocab), ("assistant",))
    system = [{"role": "system", "content": "Be brief."}] if family == "mistral_v0_2" else []
    good = [*system, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": " 😀Hello! "},
            {"role": "user", "content": "東京?"}, {"role": "assistant", "content": "Yes."}]
    held = [{"role": "user", "content": "say </s>"}, {"role": "assistant", "content": "\u2581no"}]
    chats = [good, held, good[:3], [{"role": "user", "content": " "}, {"role": "assistant", "content": ""}]]
    RENDERED.clear()
    _assert_same(*_both(shape, chats))
    assert RENDERED == {"tokenizer_config.json": {"render": "pattern", "family": family}}
    ok, texts = render_column(shape.template, pa.array(chats))
    assert ok.tolist() == [True, True, True, True]
    assert texts.to_pylist() == render_chats(shape.template, chats)[0]
    # the pattern's conversations whose texts hold an added token's text or the replacement go to Jinja, the others
    # stay on the kernel: the layout laid out again without them
    laid = render_layout(shape.template, pa.array(chats))
    got = encode_layout(shape.encoder, laid[1], frozenset(["assistant"]))
    assert got.tolist() == [False, True, False, False]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral_v0_2", "mistral_v0_3"])
def test_a_mistral_plan_equals_the_jinja_path_s_at_two_ranks(tmp_path, family):
    from benchmarks import sft_data

    got = sft_data.real_tokenizer(family, tmp_path / "tok")
    if got is None:
        pytest.skip("needs Mistral's model files and templates (MISTRAL_COMMON_DATA, CHAT_TEMPLATES_DATA)")
    tok, config = map(str, got)
    chats = sft_data.make_chats(tmp_path / "chats", 120, files=2, system_share=sft_data.MISTRAL[family][1])
    rows = [json.loads(line) for path in chats for line in open(path, encoding="utf-8")]
    _assert_same(*_both(_shape((tok, config), ("assistant",)), [r["messages"] for r in rows]))
    plans = {}
    for fast in ("1", "0"):  # the second: every text through tokenizers, the conversations through Jinja
        out = tmp_path / f"plan-{fast}"
        run_sortpack(["run", *map(str, chats), "-o", str(out), "--chat-template", config, "--tokenizer", tok,
                      "--rows", "4096", "--store-tokens"], ranks=2, env={"SORTPACK_FAST_TOKENIZER": fast})
        plans[fast] = out
    assert read_manifest(plans["1"])["provenance"]["chat_render"] == {"tokenizer_config.json": {
        "render": "pattern", "family": family}}
    assert "chat_render" not in read_manifest(plans["0"])["provenance"]
    for name in sorted(p.name for p in plans["1"].glob("*.arrow")):
        assert (plans["1"] / name).read_bytes() == (plans["0"] / name).read_bytes(), name


# --- prompt/completion pairs: whole columns through the compiled path ------------------------------------------------
@pytest.fixture(scope="module")
def pair_tokenizers(tmp_path_factory, families) -> dict:
    """Return style -> tokenizer.json: the chat BPE (no post-processor), and trained ones with Llama 3's BOS template
    and Qwen 2's EOS template (added tokens among them)."""
    from tokenizer_fixtures import stdlib_sources, train

    folder = tmp_path_factory.mktemp("pairs")
    out = {"chat": families["llama3"][0]}
    for style in ("llama3", "qwen2"):
        out[style] = train(folder / f"{style}.json", style, stdlib_sources(3), vocab=600)
    return out


PAIR_PIECES = ["hello", " world", "naïve", "東京", " ", "\n", "<|endoftext|>", "<|im_end|>", "<|im_start|>", "x"]


@pytest.mark.parametrize("style", ["chat", "llama3", "qwen2"])
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pairs=st.lists(st.tuples(*[st.lists(st.sampled_from(PAIR_PIECES), max_size=6).map("".join)] * 2),
                      min_size=1, max_size=8), eos=st.sampled_from(["<|endoftext|>", "<|im_start|>"]))
def test_pairs_in_whole_columns_give_trl_s_encoding(pair_tokenizers, style, pairs, eos):
    from sortpack.inputs.finetune.pairs import prompt_completion, trl_columns

    encoder = load_tokenizer(pair_tokenizers[style], "--tokenizer")
    if encoder.token_to_id(eos) is None:
        return
    prompts, completions = (pa.array(list(c), pa.string()) for c in zip(*pairs))
    fast = trl_columns(encoder, prompts, completions, eos)
    assert fast is not None  # an added token that cannot overlap itself: the column path
    _assert_same(fast, prompt_completion(encoder.hf, prompts.to_pylist(), completions.to_pylist(), eos))
