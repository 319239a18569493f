"""Fine-tuning inputs: token ids and their loss-target labels from the three dataset shapes SFT tools use.

- ``labels``: a token-id list column with a ``labels`` list column aligned to it (-100: no target);
- ``prompt_completion``: text columns encoded as a pair, prompt then completion, with the special
  tokens the tokenizer's post-processor puts around them; targets are the completion's tokens and
  the special tokens after it;
- ``chat``: a ``messages`` column of ``{role, content}`` rendered with the model's chat template
  (the ids ``transformers``' ``apply_chat_template(..., tokenize=True)`` gives); targets are the
  tokens of the ``train_on`` roles' turns (by default the assistant's).

A target is a position whose label is not -100; labels hold the token id there (Hugging Face's
convention, aligned to ``input_ids``: the model shifts them). Encoding works a batch at a time:
one ``encode_batch`` per batch and numpy for the label masks.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..arrow_types import is_list, is_text, plain_column
from ..errors import SortpackError, one_line

IGNORE_INDEX = -100  # the label of a position without a target (PyTorch's and Hugging Face's default)
SHAPES = ("labels", "prompt_completion", "chat")
DEFAULT_TRAIN_ON = ("assistant",)
_BATCH = 4096  # texts per encode_batch call
_MARKER = "\ue000sortpack-content\ue001"  # private-use characters: never in a template's own text
# what transformers passes a chat template from the tokenizer's special tokens (its SPECIAL_TOKENS_ATTRIBUTES)
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass
class Encoded:
    """Token ids and labels of a batch of samples: ``ids``/``labels`` list<int32> arrays, ``sizes`` and
    ``targets`` (int64 per sample: tokens, and the loss targets: positions after the first whose label is
    not -100, what a collate trains, as it gives every document's first position no target)."""

    ids: pa.Array
    labels: pa.Array
    sizes: np.ndarray
    targets: np.ndarray


def _lists(values: np.ndarray, counts: np.ndarray) -> pa.Array:
    """Return a list<int32> array of ``values`` cut by ``counts``."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int32, copy=False), pa.int32()))


def _labels(ids: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Return the labels of flat ``ids``: the id where ``target`` holds, else -100."""
    return np.where(target, ids, IGNORE_INDEX).astype(np.int32)


def _segment_sums(flags: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Return the number of true ``flags`` in each run of ``counts`` positions."""
    cum = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
    ends = np.cumsum(counts, dtype=np.int64)
    return cum[ends] - cum[ends - counts]


def _targets(flags: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Return each run's loss targets: its true ``flags`` but the first position's (no target: nothing precedes it)."""
    counts = np.asarray(counts, dtype=np.int64)
    first = np.cumsum(counts) - counts
    head = np.zeros(len(counts), dtype=np.int64)
    some = counts > 0
    head[some] = flags[first[some]]
    return _segment_sums(flags, counts) - head


def _flat_ids(encs) -> tuple[np.ndarray, np.ndarray]:
    """Return the encodings' ids one after another (int64) and each one's count."""
    counts = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
    ids = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.int64, count=int(counts.sum()))
    return ids, counts


def _encoder(tokenizer):
    return getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)


# --- (a) a token-id column with a labels column ---------------------------------------------------------


def pretokenized(ids_col, labels_col, where: str, ids_name: str = "input_ids",
                 labels_name: str = "labels") -> Encoded:
    """Return the ``Encoded`` of a token-id list column and its aligned labels list column, checked.

    Raises SortpackError (naming ``where`` and the column) when a column is not a list of
    integers, holds nulls, or a sample's labels differ in length from its ids.
    """
    import pyarrow.compute as pc

    cols = []
    for name, col in ((ids_name, ids_col), (labels_name, labels_col)):
        col = plain_column(col) if isinstance(col, pa.ChunkedArray) else col
        if not is_list(col.type) or not pa.types.is_integer(col.type.value_type):
            raise SortpackError(f"{where}: column {name!r} is {col.type}, not a list of token ids")
        if col.null_count:
            raise SortpackError(f"{where}: column {name!r} has {col.null_count} null values")
        cols.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    ids, labels = cols
    sizes = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = pc.list_value_length(labels).to_numpy(zero_copy_only=False).astype(np.int64)
    bad = np.flatnonzero(sizes != lengths)
    if len(bad):
        i = int(bad[0])
        raise SortpackError(f"{where}: column {labels_name!r} has {lengths[i]} labels in row {i}, "
                            f"column {ids_name!r} {sizes[i]} token ids ({len(bad)} rows differ)")
    flat = pc.list_flatten(labels)
    if flat.null_count:
        raise SortpackError(f"{where}: column {labels_name!r} holds null labels")
    values = flat.to_numpy(zero_copy_only=False)
    targets = _targets(values != IGNORE_INDEX, sizes)
    return Encoded(ids, labels, sizes, targets)


# --- (b) prompt and completion texts --------------------------------------------------------------------


def _values(col, where: str, name: str, fits, kind: str) -> list:
    """Return a column's values as Python objects; one line naming the column when its type or a null is wrong."""
    col = plain_column(col) if isinstance(col, pa.ChunkedArray) else col
    if not fits(col.type):
        raise SortpackError(f"{where}: column {name!r} is {col.type}, not {kind}")
    if col.null_count:
        raise SortpackError(f"{where}: column {name!r} has {col.null_count} null values")
    return col.to_pylist()


def _texts(col, where: str, name: str) -> list:
    """Return a text column's strings (prompts or completions)."""
    return _values(col, where, name, is_text, "text")


def prompt_completion(tokenizer, prompts: Sequence[str], completions: Sequence[str]) -> Encoded:
    """Return the ``Encoded`` of prompt/completion pairs: one pair encode each, targets from the completion on.

    The tokenizer's post-processor puts its special tokens as its pair template says (e.g.
    BOS before the prompt, EOS after the completion); the targets are the completion's
    tokens and every token after them. An empty completion has no target.
    """
    parts_ids, parts_target, parts_counts = [], [], []
    encode = _encoder(tokenizer)
    for a in range(0, len(prompts), _BATCH):
        encs = encode(list(zip(prompts[a:a + _BATCH], completions[a:a + _BATCH])), add_special_tokens=True)
        ids, counts = _flat_ids(encs)
        # where each completion starts (its first token of sequence 1), its sample's length when empty
        first = np.fromiter((_first_of(e.sequence_ids, 1) for e in encs), dtype=np.int64, count=len(encs))
        first = np.where(first < 0, counts, first)
        pos = np.arange(len(ids), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        parts_ids.append(ids)
        parts_target.append(pos >= np.repeat(first, counts))
        parts_counts.append(counts)
    return _encoded(parts_ids, parts_target, parts_counts)


def _first_of(seq: list, value: int) -> int:
    try:
        return seq.index(value)
    except ValueError:
        return -1


def _encoded(parts_ids: list, parts_target: list, parts_counts: list) -> Encoded:
    ids = np.concatenate(parts_ids) if parts_ids else np.zeros(0, np.int64)
    target = np.concatenate(parts_target) if parts_target else np.zeros(0, bool)
    counts = np.concatenate(parts_counts) if parts_counts else np.zeros(0, np.int64)
    return Encoded(_lists(ids, counts), _lists(_labels(ids, target), counts), counts, _targets(target, counts))


# --- (c) chats rendered with a chat template ------------------------------------------------------------


class _Tracker(threading.local):
    """The spans of ``{% generation %}`` blocks rendered so far (per thread), None while not tracking."""

    blocks: list | None = None
    spans: list | None = None


def _environment(tracker: _Tracker):
    """Return the Jinja environment transformers renders chat templates in, ``{% generation %}`` tracked."""
    import datetime

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body and records where it lies."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

        def _generation(self, caller):
            text = caller()
            if tracker.blocks is not None and tracker.spans is not None:
                start = sum(map(len, tracker.blocks))
                tracker.spans.append((start, start + len(text)))
            return text

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' filter: Jinja's own escapes HTML characters
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # an AddedToken as tokenizer_config.json writes it
        value = value.get("content")
    return value if isinstance(value, str) else None


def _config_template(config: dict, where: str) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise SortpackError(f"--chat-template {where}: chat_template is not a string")
    return template


@dataclass
class ChatTemplate:
    """A chat template and the special tokens it is rendered with (as ``apply_chat_template`` passes them).

    Picklable: the compiled template is rebuilt on first use in each process.
    """

    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    name: str = ""
    _compiled: Any = field(default=None, repr=False, compare=False)
    _tracker: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        """Return the state to pickle: the template's text, not its compiled form."""
        return {"source": self.source, "special_tokens": self.special_tokens, "name": self.name,
                "_compiled": None, "_tracker": None}

    @property
    def has_generation(self) -> bool:
        """Return whether the template marks the assistant's text with ``{% generation %}`` blocks."""
        import re

        return re.search(r"\{%-?\s*generation\s*-?%\}", self.source) is not None

    def _template(self):
        if self._compiled is None:
            import jinja2

            self._tracker = _Tracker()
            try:
                self._compiled = _environment(self._tracker).from_string(self.source)
            except jinja2.TemplateError as exc:
                raise SortpackError(f"--chat-template {self.name}: not a Jinja template ({one_line(exc)})") from None
        return self._compiled

    def render(self, messages: list) -> tuple[str, list[tuple[int, int]]]:
        """Return the conversation rendered (no generation prompt) and the character spans of its generation blocks."""
        template, tracker = self._template(), self._tracker
        tracker.blocks, tracker.spans = [], []
        try:
            for block in template.generate(messages=messages, tools=None, documents=None,
                                           add_generation_prompt=False, **self.special_tokens):
                tracker.blocks.append(block)
            return "".join(tracker.blocks), tracker.spans
        finally:
            tracker.blocks, tracker.spans = None, None


def load_chat_template(path: str | Path) -> ChatTemplate:
    """Return the ``ChatTemplate`` of a Hugging Face ``tokenizer_config.json`` or a Jinja file.

    A JSON file gives its ``chat_template`` (or the ``chat_template.jinja`` beside it) and its
    special tokens; a Jinja file takes its special tokens from a ``tokenizer_config.json`` in
    the same directory, when there is one.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SortpackError(f"--chat-template {path}: cannot read ({one_line(exc)})") from None
    config: dict = {}
    if path.suffix == ".json":
        try:
            config = json.loads(text)
        except ValueError as exc:
            raise SortpackError(f"--chat-template {path}: not JSON ({one_line(exc)})") from None
        if not isinstance(config, dict):
            raise SortpackError(f"--chat-template {path}: not a tokenizer_config.json (an object)")
        source = _config_template(config, str(path))
        if source is None and (path.parent / "chat_template.jinja").is_file():
            source = (path.parent / "chat_template.jinja").read_text(encoding="utf-8")
        if source is None:
            raise SortpackError(f"--chat-template {path}: no chat_template in it (nor a chat_template.jinja beside it)")
    else:
        source = text
        beside = path.parent / "tokenizer_config.json"
        if beside.is_file():
            try:
                config = json.loads(beside.read_text(encoding="utf-8"))
            except ValueError:
                config = {}
    special = {k: v for k in _SPECIAL_KEYS if (v := _token_text(config.get(k))) is not None}
    template = ChatTemplate(source, special, path.name)
    template._template()  # a syntax error is reported now, once
    return template


def _turn_spans(template: ChatTemplate, messages: list, roles: frozenset, where: str) -> tuple[str, list]:
    """Return the rendered conversation and the character spans of the ``roles``' turns, rendered prefix by prefix.

    Turn k is what rendering ``messages[:k + 1]`` adds to rendering ``messages[:k]``; its
    target runs from its content to the end of the turn (the end-of-turn marker included,
    trailing whitespace not). Where the content starts is where a marker put in its place
    renders (a search for the text could find it in the turn's header).
    """
    spans, before = [], ""
    for k, message in enumerate(messages):
        text, _ = template.render(messages[:k + 1])
        if not text.startswith(before):
            raise SortpackError(f"{where}: the chat template does not render a conversation turn by turn "
                                "(a prefix renders differently); use a template with {% generation %} blocks "
                                "and --train-on assistant")
        if isinstance(message, dict) and message.get("role") in roles:
            marked, _ = template.render([*messages[:k], {**message, "content": _MARKER}])
            at = marked.find(_MARKER, len(before))
            end = len(text.rstrip())
            if at >= 0 and end > at:
                spans.append((at, end))
        before = text
    return before, spans


def _messages(col, where: str, name: str) -> list:
    """Return a messages column's conversations (lists of {role, content})."""
    return _values(col, where, name, is_list, "a list of {role, content} messages")


def render_chats(template: ChatTemplate, conversations: Sequence[list], train_on: Sequence[str] = DEFAULT_TRAIN_ON,
                 where: str = "messages") -> tuple[list[str], list[list[tuple[int, int]]]]:
    """Return each conversation rendered and the character spans of its targets.

    With ``train_on`` the assistant alone and a template with ``{% generation %}`` blocks,
    the targets are those blocks (transformers' ``assistant_masks``); otherwise the turns of
    the ``train_on`` roles, found by rendering each conversation prefix by prefix.
    """
    import jinja2

    roles = frozenset(train_on)
    generation = template.has_generation and roles == frozenset(DEFAULT_TRAIN_ON)
    texts, spans = [], []
    try:
        for messages in conversations:
            messages = [dict(m) for m in messages] if messages else []
            if generation:
                text, found = template.render(messages)
            else:
                text, found = _turn_spans(template, messages, roles, where)
            texts.append(text)
            spans.append(found)
    except jinja2.TemplateError as exc:
        raise SortpackError(f"{where}: the chat template {template.name} fails on a conversation "
                            f"({one_line(exc)})") from None
    return texts, spans


def encode_chats(tokenizer, template: ChatTemplate, conversations: Sequence[list],
                 train_on: Sequence[str] = DEFAULT_TRAIN_ON, where: str = "messages") -> Encoded:
    """Return the ``Encoded`` of conversations: ids as ``apply_chat_template(..., tokenize=True)``, targets the
    tokens whose characters overlap the ``train_on`` roles' turns (``render_chats``)."""
    parts_ids, parts_target, parts_counts = [], [], []
    encode = tokenizer.encode_batch  # not encode_batch_fast: it leaves the character offsets out
    for a in range(0, len(conversations), _BATCH):
        texts, spans = render_chats(template, conversations[a:a + _BATCH], train_on, where)
        encs = encode(texts, add_special_tokens=False)  # the template wrote the special tokens
        ids, counts = _flat_ids(encs)
        offsets = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encs)), dtype=np.int64,
                              count=2 * len(ids)).reshape(-1, 2)
        # every text's characters on one axis: a token is a target when one of its characters is
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        base = np.cumsum(lengths) - lengths
        n_spans = np.fromiter(map(len, spans), dtype=np.int64, count=len(spans))
        flat = np.array(list(chain.from_iterable(spans)), dtype=np.int64).reshape(-1, 2)
        flat += np.repeat(base, n_spans)[:, None]
        marks = np.zeros(int(lengths.sum()) + 1, dtype=np.int64)
        np.add.at(marks, flat[:, 0], 1)
        np.add.at(marks, flat[:, 1], -1)
        inside = np.concatenate(([0], np.cumsum(np.cumsum(marks)[:-1] > 0)))
        tok_base = np.repeat(base, counts)
        target = inside[tok_base + offsets[:, 1]] > inside[tok_base + offsets[:, 0]]
        parts_ids.append(ids)
        parts_target.append(target)
        parts_counts.append(counts)
    return _encoded(parts_ids, parts_target, parts_counts)


# --- the shape of a fine-tuning dataset -----------------------------------------------------------------


@dataclass(eq=False)  # hashed by identity: a collate's tokenize= keys the reader's cache of cut documents
class FineTuneShape:
    """Which of the three shapes a dataset has and what encoding it needs.

    ``kind`` is ``labels`` (``column`` the token ids, ``labels_column`` their labels),
    ``prompt_completion`` (``prompt_column``, ``completion_column``) or ``chat`` (``column``
    the messages); ``tokenizer`` and ``template`` are loaded objects (the text shapes need a
    tokenizer, ``chat`` a template).
    """

    kind: str
    column: str | None = None
    labels_column: str | None = None
    prompt_column: str = "prompt"
    completion_column: str = "completion"
    train_on: tuple[str, ...] = DEFAULT_TRAIN_ON
    tokenizer: Any = None
    template: ChatTemplate | None = None

    def __post_init__(self):
        # the Hugging Face Tokenizer itself (load_tokenizer wraps it): the chats need its character offsets and the
        # pairs its post-processor, and it pickles (a collate's tokenize= goes to DataLoader workers)
        self.tokenizer = getattr(self.tokenizer, "hf", self.tokenizer)

    def columns(self) -> list[str]:
        """Return the input columns the shape reads."""
        if self.kind == "prompt_completion":
            return [self.prompt_column, self.completion_column]
        if self.kind == "labels":
            return [c for c in (self.column, self.labels_column) if c]
        return [self.column] if self.column else []

    def text_columns(self) -> list[str]:
        """Return the text columns among ``columns()`` (read as strings from CSV and JSON)."""
        return [self.prompt_column, self.completion_column] if self.kind == "prompt_completion" else []

    def encode(self, table: pa.Table, where: str) -> Encoded:
        """Return the ``Encoded`` of every row of ``table`` (``where`` names the file in errors)."""
        for name in self.columns():
            if name not in table.column_names:
                raise SortpackError(f"{where}: no column {name!r} (columns: {', '.join(table.column_names)})")
        if self.kind == "labels":
            assert self.column is not None and self.labels_column is not None
            return pretokenized(table.column(self.column), table.column(self.labels_column), where,
                                self.column, self.labels_column)
        if self.kind == "prompt_completion":
            prompts = _texts(table.column(self.prompt_column), where, self.prompt_column)
            completions = _texts(table.column(self.completion_column), where, self.completion_column)
            return prompt_completion(self.tokenizer, prompts, completions)
        assert self.column is not None and self.template is not None
        return encode_chats(self.tokenizer, self.template, _messages(table.column(self.column), where, self.column),
                            self.train_on, f"{where}: column {self.column!r}")

    def __call__(self, item: dict) -> tuple[np.ndarray, np.ndarray]:
        """Return (ids, labels) of one dataset row (a dict of its columns): a collate's ``tokenize=``."""
        table = pa.Table.from_pylist([{c: item[c] for c in self.columns()}])
        enc = self.encode(table, "item")
        ids = enc.ids.values.to_numpy(zero_copy_only=False).astype(np.int64)
        labels = enc.labels.values.to_numpy(zero_copy_only=False).astype(np.int64)
        return ids, labels


def check_shape_options(labels_column: str | None, pair_columns: str | None, chat_template: str | None,
                        train_on: Sequence[str] | None, has_tokenizer: bool) -> str | None:
    """Return the option that names the fine-tuning shape (None: no shape), raising SortpackError (one line) where
    the options cannot work together: two shapes, ``--train-on`` without chats or naming no role, a text shape
    without a tokenizer. Decided from the options alone, before any file is read."""
    chosen = [o for o, v in (("--labels-column", labels_column), ("--prompt-column/--completion-column", pair_columns),
                             ("--chat-template", chat_template)) if v]
    if len(chosen) > 1:
        raise SortpackError(f"{' and '.join(chosen)} name different dataset shapes: give one")
    if train_on is not None and not chat_template:
        raise SortpackError("--train-on chooses the roles of a chat: it needs --chat-template")
    if train_on is not None and (not train_on or any(not r for r in train_on)):
        raise SortpackError("--train-on: expected role names such as assistant or user,assistant")
    if not chosen:
        return None
    if not labels_column and not has_tokenizer:
        raise SortpackError(f"{chosen[0]} needs --tokenizer tokenizer.json (the model's tokenizer)")
    return chosen[0]


def fine_tune_shape(column: str | None, labels_column: str | None = None, prompt_column: str | None = None,
                    completion_column: str | None = None, chat_template: str | None = None,
                    train_on: Sequence[str] | None = None, tokenizer=None) -> FineTuneShape | None:
    """Return the ``FineTuneShape`` the options name (None when they name none), raising SortpackError on a mix.

    ``--labels-column``: token ids (``column``, default ``input_ids``) with labels;
    ``--prompt-column``/``--completion-column``: prompt/completion texts; ``--chat-template``:
    conversations (``column``, default ``messages``). ``tokenizer`` is a loaded tokenizer.
    """
    chosen = check_shape_options(labels_column, prompt_column or completion_column, chat_template, train_on,
                                 tokenizer is not None)
    if chosen is None:
        return None
    if labels_column:
        return FineTuneShape("labels", column=column or "input_ids", labels_column=labels_column)
    if chat_template:
        roles = tuple(train_on) if train_on else DEFAULT_TRAIN_ON
        return FineTuneShape("chat", column=column or "messages", train_on=roles, tokenizer=tokenizer,
                             template=load_chat_template(chat_template))
    return FineTuneShape("prompt_completion", prompt_column=prompt_column or "prompt",
                         completion_column=completion_column or "completion", tokenizer=tokenizer)


def recorded_shape(options: dict, tokenizer: str | None, chat_template: str | None, why: str) -> FineTuneShape:
    """Return the ``FineTuneShape`` a measured plan records (``options["fine_tune"]``), loaded again.

    ``tokenizer`` and ``chat_template`` are the files given to the job (checked by name against
    what the plan was measured with); ``why`` names what needs them in the error line.
    """
    from .specs import load_tokenizer

    fine_tune = options.get("fine_tune") or {}
    if fine_tune.get("shape") == "labels":
        return shape_of_record(options, None, None, why)
    recorded = options.get("tokenizer")
    if not tokenizer:
        raise SortpackError(f"{why} needs --tokenizer (the tokenizer.json the plan was measured with"
                            f"{f': {recorded}' if recorded else ''})")
    check_recorded_file("--tokenizer", tokenizer, recorded, "the plan was measured with")
    return shape_of_record(options, load_tokenizer(tokenizer, "--tokenizer"), chat_template, why)


def check_recorded_file(option: str, given: str, recorded: str | None, what: str) -> None:
    """Raise SortpackError unless ``given`` has the file name a manifest recorded (``recorded``; None: anything)."""
    if recorded and Path(given).name != Path(recorded).name:
        raise SortpackError(f"{option} {given}: {what} {Path(recorded).name!r}")


def shape_of_record(options: dict, tokenizer: Any, chat_template: str | None, why: str | None) -> FineTuneShape:
    """Return the ``FineTuneShape`` of a plan's recorded analyze options with ``tokenizer`` (loaded) and the chat
    template at ``chat_template`` (checked by name against the plan's).

    ``why`` names what needs the chat template when a job renders the chats again (None: it may
    be missing, as in ``run``, whose ids come from analyze's own rendering).
    """
    fine_tune = options.get("fine_tune") or {}
    shape = fine_tune.get("shape")
    if shape == "labels":
        return FineTuneShape("labels", column=options.get("column") or "input_ids",
                             labels_column=fine_tune["labels_column"])
    if shape == "chat":
        template = None
        if chat_template:
            check_recorded_file("--chat-template", chat_template, fine_tune.get("chat_template"),
                                "the plan's chats were rendered with")
            template = load_chat_template(chat_template)
        elif why is not None:
            raise SortpackError(f"{why} needs --chat-template (the template the chats were rendered with: "
                                f"{fine_tune.get('chat_template')})")
        return FineTuneShape("chat", column=options.get("column") or "messages", tokenizer=tokenizer,
                             template=template, train_on=tuple(fine_tune.get("train_on") or DEFAULT_TRAIN_ON))
    return FineTuneShape("prompt_completion", prompt_column=fine_tune.get("prompt_column") or "prompt",
                         completion_column=fine_tune.get("completion_column") or "completion", tokenizer=tokenizer)


def read_labels(shape: FineTuneShape, files: list[dict], ids: np.ndarray, sizes: np.ndarray) -> pa.Array:
    """Return the labels (list<int32>, one row per id) of the samples ``ids``, read back from the plan's input
    ``files`` and encoded again with ``shape``.

    Only the input units that hold one of ``ids`` are read. Raises one line where a sample no
    longer measures its recorded ``sizes`` (the input changed since analyze).
    """
    from .pieces import read_sample_rows

    ids = np.asarray(ids, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    at, parts = [], []
    for pos, table, path in read_sample_rows(files, ids, shape.columns(), shape.text_columns() or None):
        enc = shape.encode(table, path)
        bad = np.flatnonzero(np.asarray(enc.sizes, dtype=np.int64) != sizes[pos])
        if len(bad):
            i = int(bad[0])
            raise SortpackError(f"{path}: sample {int(ids[pos[i]])} has {int(enc.sizes[i])} tokens, the plan was "
                                f"measured at {int(sizes[pos[i]])} (the input changed since analyze)")
        at.append(pos)
        parts.append(enc.labels)
    if not parts:
        return pa.array([], pa.list_(pa.int32()))
    labels = pa.concat_arrays([p.cast(pa.list_(pa.int32())) for p in parts])
    return labels.take(pa.array(np.argsort(np.concatenate(at), kind="stable")))
