"""The chat shape: a ``messages`` column rendered with the model's chat template, the ``--train-on`` roles' turns
the targets.

Messages are taken as ``transformers``' ``apply_chat_template`` takes them: keys whose value is
null are dropped (an assistant's tool call has no content), reasoning is passed under all its
names; a message that is not an object, or has no role, is one error line naming the file, the
row and the message. So is a conversation the template fails on, whatever it raises.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...arrow_types import is_list
from ...errors import SortpackError, one_line
from .base import FineTuneShape, check_recorded_file
from .encoded import Encoded, RowName, Rows, checked_column, encoded, flat_ids, rows_of
from .families import TurnRule, turn_rule
from .template import ChatTemplate, load_chat_template

DEFAULT_TRAIN_ON = ("assistant",)
BATCH = 4096  # conversations per encode_batch call
_MARKER = "\ue000sortpack-content\ue001"  # private-use characters: never in a template's own text
_WHAT = "a list of {role, content} messages"
_REASONING = ("reasoning_content", "thinking", "reasoning")  # the names transformers passes reasoning under


def conversations(col, rows: Rows, name: str) -> list:
    """Return a messages column's conversations (lists of messages); one line naming the column when its type or a
    null is wrong."""
    return checked_column(col, rows, name, is_list, _WHAT).to_pylist()


def _message(value, at: str | RowName, k: int) -> dict:
    """Return message ``k`` as ``apply_chat_template`` passes it to the template (null keys dropped, reasoning
    aliased); one line where it is no object or has no role."""
    if not isinstance(value, dict):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise SortpackError(f"{at}: message {k} is {shown}, not a {{role, content}} object")
    message = {key: v for key, v in value.items() if v is not None}
    role = message.get("role")
    if not isinstance(role, str) or not role:
        what = "has no role" if role is None else f"has role {role!r}, not a name"
        raise SortpackError(f"{at}: message {k} {what} (its keys: {', '.join(sorted(message)) or 'none'})")
    reasoning = next((message[key] for key in _REASONING if key in message), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def messages_of(conversation, at: str | RowName) -> list[dict]:
    """Return a conversation's messages as the template receives them (``_message``)."""
    return [_message(m, at, k) for k, m in enumerate(conversation or [])]


def _render(template: ChatTemplate, messages: list, at: str | RowName, k: int) -> tuple[str, list]:
    """Return ``template.render(messages)``; whatever the template raises is one line naming message ``k``."""
    try:
        return template.render(messages)
    except SortpackError:
        raise
    except Exception as exc:  # a template is code: TemplateError, TypeError, ZeroDivisionError, ...
        role = messages[k].get("role") if 0 <= k < len(messages) else None
        raise SortpackError(f"{at}: message {k}{f' ({role})' if role else ''}: the chat template {template.name} "
                            f"cannot render it ({type(exc).__name__}: {one_line(exc)})") from None


def _render_whole(template: ChatTemplate, messages: list, at: str | RowName) -> tuple[str, list]:
    """Return the whole conversation rendered; on a failure, the first message whose prefix fails is named."""
    try:
        return _render(template, messages, at, len(messages) - 1)
    except SortpackError:
        for k in range(len(messages) - 1):  # the error path only: which message does the template fail on
            _render(template, messages[:k + 1], at, k)
        raise


def _content_start(template: ChatTemplate, messages: list, k: int, text: str, turn: int) -> int:
    """Return where message ``k``'s content starts in ``text`` (the rendering of ``messages[:k + 1]``): where it and
    the rendering with a marker in place of the content part (a search for the text could find it in the turn's
    header; a turn without text content, a tool call, starts where the marker would have)."""
    try:
        marked, _ = template.render([*messages[:k], {**messages[k], "content": _MARKER}])
    except Exception:  # a template that cannot take text content there: the whole turn
        return turn
    n = min(len(text), len(marked))
    if n <= turn:
        return turn
    ours, theirs = (np.frombuffer(t[turn:n].encode("utf-32-le"), np.uint32) for t in (text, marked))
    differ = np.flatnonzero(ours != theirs)
    return turn + (int(differ[0]) if len(differ) else n - turn)


def _turn_spans(template: ChatTemplate, messages: list, roles: frozenset, at: str | RowName, rule: TurnRule
                ) -> tuple[str, list]:
    """Return the rendered conversation and the character spans of the ``roles``' turns, rendered prefix by prefix.

    Turn k is what rendering ``messages[:k + 1]`` adds to rendering ``messages[:k]``; its target
    runs from its content to the end of the turn as ``rule`` cuts it. A chosen turn must render
    the same once later messages follow (its span is then where it is in the whole conversation).
    """
    spans, before, chosen = [], "", []
    for k, message in enumerate(messages):
        text, _ = _render(template, messages[:k + 1], at, k)
        if message["role"] in roles:
            if not text.startswith(before):
                raise _not_turn_by_turn(template, at, k)
            start, end = rule.span(text, len(before), _content_start(template, messages, k, text, len(before)))
            if end > start:
                spans.append((start, end))
                chosen.append((k, text[:end]))
        before = text
    for k, head in chosen:
        if not before.startswith(head):
            raise _not_turn_by_turn(template, at, k)
    return before, spans


def _not_turn_by_turn(template: ChatTemplate, at: str | RowName, k: int) -> SortpackError:
    return SortpackError(f"{at}: message {k}: the chat template {template.name} renders this turn differently once "
                         "other messages follow, so its targets cannot be found turn by turn; use a template with "
                         "{% generation %} blocks and --train-on assistant")


def render_chats(template: ChatTemplate, chats: Sequence[list], train_on: Sequence[str] = DEFAULT_TRAIN_ON,
                 where: str | Rows = "messages") -> tuple[list[str], list[list[tuple[int, int]]]]:
    """Return each conversation rendered and the character spans of its targets.

    With ``train_on`` the assistant alone and a template with ``{% generation %}`` blocks,
    the targets are those blocks (transformers' ``assistant_masks``); otherwise the turns of
    the ``train_on`` roles, found by rendering each conversation prefix by prefix and cut by
    the template family's rule (``families.turn_rule``). ``where`` names the rows in errors.
    """
    rows = rows_of(where)
    roles = frozenset(train_on)
    generation = template.has_generation and roles == frozenset(DEFAULT_TRAIN_ON)
    rule = turn_rule(template.source)[1]
    texts, spans = [], []
    for i, conversation in enumerate(chats):
        at = rows.named(i)  # named only in an error line (counting a JSONL file's lines costs a read of it)
        messages = messages_of(conversation, at)
        text, found = _render_whole(template, messages, at) if generation else \
            _turn_spans(template, messages, roles, at, rule)
        texts.append(text)
        spans.append(found)
    return texts, spans


def _target_flags(texts: list[str], spans: list, encs, counts: np.ndarray) -> np.ndarray:
    """Return, per token, whether one of its characters lies in a target span of its text."""
    n = int(counts.sum())
    offsets = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encs)), dtype=np.int64,
                          count=2 * n).reshape(-1, 2)
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
    return inside[tok_base + offsets[:, 1]] > inside[tok_base + offsets[:, 0]]


def roles_in(chats: Sequence[list]) -> frozenset[str]:
    """Return the roles the conversations' messages name (``--train-on`` must name one of them)."""
    return frozenset(m["role"] for chat in chats for m in chat or () if isinstance(m, dict)
                     and isinstance(m.get("role"), str))


def encode_chats(tokenizer, template: ChatTemplate, chats: Sequence[list], train_on: Sequence[str] = DEFAULT_TRAIN_ON,
                 where: str | Rows = "messages") -> Encoded:
    """Return the ``Encoded`` of conversations: ids as ``apply_chat_template(..., tokenize=True)``, targets the
    tokens whose characters overlap the ``train_on`` roles' turns (``render_chats``), and the roles they hold."""
    rows = rows_of(where)
    parts: tuple[list, list, list] = ([], [], [])
    encode = tokenizer.encode_batch  # not encode_batch_fast: it leaves the character offsets out
    for a in range(0, len(chats), BATCH):
        texts, spans = render_chats(template, chats[a:a + BATCH], train_on, Rows(rows.path, rows.first + a,
                                                                                  rows.position))
        encs = encode(texts, add_special_tokens=False)  # the template wrote the special tokens
        ids, counts = flat_ids(encs)
        for part, value in zip(parts, (ids, _target_flags(texts, spans, encs, counts), counts)):
            part.append(value)
    return encoded(*parts, roles=roles_in(chats))


@dataclass(frozen=True, eq=False, kw_only=True)
class ChatShape(FineTuneShape):
    """``--chat-template``: conversations (``column``, default ``messages``) rendered with the template at
    ``chat_template`` (a path; in a plan's record, the file's name), the ``train_on`` roles' turns the targets."""

    name: ClassVar[str] = "chat"
    option: ClassVar[str] = "--chat-template"

    chat_template: str = ""
    column: str = "messages"
    train_on: tuple[str, ...] = DEFAULT_TRAIN_ON
    template_sha256: str | None = None  # what the plan's chats were rendered with (its text and special tokens)
    template: Any = field(default=None, repr=False)  # loaded: the ChatTemplate

    def columns(self) -> list[str]:
        """Return the messages column."""
        return [self.column]

    def encode_rows(self, table, rows: Rows) -> Encoded:
        """Return the conversations rendered and encoded (``encode_chats``), with the roles they hold."""
        if self.template is None:
            raise SortpackError(f"{self.option}: the chats' template is not loaded")
        col = table.column(self.column)
        if self.encoder is not None:
            from .fast_chats import encode_fast

            got = encode_fast(self, checked_column(col, rows, self.column, is_list, _WHAT), rows,
                              lambda chats, at: encode_chats(self.tokenizer, self.template, chats, self.train_on, at))
            if got is not None:
                return got
        return encode_chats(self.tokenizer, self.template, conversations(col, rows, self.column), self.train_on, rows)

    def record(self) -> dict:
        """Return the template's file name, the roles that train and the digests of the template and tokenizer."""
        digests = {k: v for k, v in (("tokenizer_sha256", self.tokenizer_sha256),
                                     ("template_sha256", self.template_sha256)) if v}
        return {"shape": self.name, "chat_template": Path(self.chat_template).name, "train_on": list(self.train_on),
                **digests}

    @classmethod
    def from_record(cls, record: dict, column: str | None) -> ChatShape:
        """Return the shape of a plan's record."""
        return cls(chat_template=record.get("chat_template") or "", column=column or "messages",
                   train_on=tuple(record.get("train_on") or DEFAULT_TRAIN_ON),
                   template_sha256=record.get("template_sha256"), tokenizer_sha256=record.get("tokenizer_sha256"))

    def validate(self, has_tokenizer: bool) -> None:
        """Refuse ``--train-on`` without role names."""
        super().validate(has_tokenizer)
        if not self.train_on or any(not r for r in self.train_on):
            raise SortpackError("--train-on: expected role names such as assistant or user,assistant")

    def resolved(self, tokenizer_path: str | None) -> ChatShape:
        """Return the shape with the digests of the tokenizer and of the template (text and special tokens)."""
        out = super().resolved(tokenizer_path)
        assert isinstance(out, ChatShape)
        return dataclasses.replace(out, template_sha256=load_chat_template(self.chat_template).digest)

    def loaded(self, tokenizer, chat_template: str | None = None, why: str | None = None) -> ChatShape:
        """Return the shape with ``tokenizer`` and its template loaded: from ``chat_template`` (a job's
        ``--chat-template``, checked by name and digest against the plan's), else the shape's own path; ``why``
        (what renders the chats again) refuses a missing ``chat_template``."""
        out = super().loaded(tokenizer)
        assert isinstance(out, ChatShape)
        if chat_template is None and why is not None:
            raise SortpackError(f"{why} needs --chat-template (the template the chats were rendered with: "
                                f"{Path(self.chat_template).name})")
        path = chat_template or self.chat_template
        if chat_template:
            check_recorded_file("--chat-template", chat_template, self.chat_template,
                                "the plan's chats were rendered with")
        template = load_chat_template(path)
        if self.template_sha256 and template.digest != self.template_sha256:
            raise SortpackError(f"--chat-template {path}: not the template the plan's chats were rendered with (its "
                                f"text or special tokens changed since: sha256 {template.digest[:12]}..., the plan's "
                                f"{self.template_sha256[:12]}...)")
        return dataclasses.replace(out, template=template)

    def check_roles(self, seen: frozenset[str]) -> None:
        """Raise SortpackError (one line, every rank) when no message has a ``--train-on`` role: nothing trains."""
        if not set(self.train_on) & set(seen):
            shown = ", ".join(sorted(seen)) or "none"
            raise SortpackError(f"--train-on {','.join(self.train_on)}: no message has that role (the roles the "
                                f"messages hold: {shown})", collective=True)
