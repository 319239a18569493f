"""The shape of a fine-tuning dataset (``FineTuneShape``): which columns it reads and how it encodes them, from the
options or from what a plan recorded; and the labels of a plan's samples read back from its inputs."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import SortpackError
from .chats import DEFAULT_TRAIN_ON, conversations, encode_chats
from .encoded import Encoded, Rows, rows_of
from .labels import pretokenized
from .pairs import prompt_completion, texts
from .template import ChatTemplate, load_chat_template

SHAPES = ("labels", "prompt_completion", "chat")


def file_digest(path: str) -> str:
    """Return the sha256 of a file's bytes (a tokenizer a plan was measured with)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(eq=False)  # hashed by identity: a collate's tokenize= keys the reader's cache of cut documents
class FineTuneShape:
    """Which of the three shapes a dataset has and what encoding it needs.

    ``kind`` is ``labels`` (``column`` the token ids, ``labels_column`` their labels),
    ``prompt_completion`` (``prompt_column``, ``completion_column``; ``eos_token`` appended to each
    completion as TRL does, None: encoded as a pair) or ``chat`` (``column`` the messages);
    ``tokenizer`` and ``template`` are loaded objects (the text shapes need a tokenizer, ``chat`` a
    template; a labels column checks its labels against the tokenizer's vocabulary when it has one).
    """

    kind: str
    column: str | None = None
    labels_column: str | None = None
    prompt_column: str = "prompt"
    completion_column: str = "completion"
    train_on: tuple[str, ...] = DEFAULT_TRAIN_ON
    tokenizer: Any = None
    template: ChatTemplate | None = None
    eos_token: str | None = None

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

    def encode(self, table: pa.Table, where: str | Rows) -> Encoded:
        """Return the ``Encoded`` of every row of ``table`` (``where``: its file, and how its rows are named)."""
        rows = rows_of(where)
        for name in self.columns():
            if name not in table.column_names:
                raise SortpackError(f"{rows.path}: no column {name!r} (columns: {', '.join(table.column_names)})")
        if self.kind == "labels":
            assert self.column is not None and self.labels_column is not None
            vocab = self.tokenizer.get_vocab_size(with_added_tokens=True) if self.tokenizer is not None else None
            return pretokenized(table.column(self.column), table.column(self.labels_column), rows, self.column,
                                self.labels_column, vocab)
        if self.kind == "prompt_completion":
            prompts = texts(table.column(self.prompt_column), rows, self.prompt_column)
            completions = texts(table.column(self.completion_column), rows, self.completion_column)
            return prompt_completion(self.tokenizer, prompts, completions, self.eos_token)
        assert self.column is not None and self.template is not None
        chats = conversations(table.column(self.column), rows, self.column)
        return encode_chats(self.tokenizer, self.template, chats, self.train_on, rows)

    def check_roles(self, seen: set[str] | frozenset[str]) -> None:
        """Raise SortpackError (one line) when the chats' messages (``seen``: every role they hold) have none of
        the ``--train-on`` roles: the plan would train nothing."""
        if self.kind == "chat" and not set(self.train_on) & set(seen):  # (other shapes hold no roles)
            shown = ", ".join(sorted(seen)) or "none"
            raise SortpackError(f"--train-on {','.join(self.train_on)}: no message has that role (the roles the "
                                f"messages hold: {shown})", collective=True)

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
                    train_on: Sequence[str] | None = None, tokenizer=None, eos_token: str | None = None
                    ) -> FineTuneShape | None:
    """Return the ``FineTuneShape`` the options name (None when they name none), raising SortpackError on a mix.

    ``--labels-column``: token ids (``column``, default ``input_ids``) with labels;
    ``--prompt-column``/``--completion-column``: prompt/completion texts (``eos_token``: appended
    to each completion, as TRL does; None: encoded as a pair); ``--chat-template``:
    conversations (``column``, default ``messages``). ``tokenizer`` is a loaded tokenizer.
    """
    chosen = check_shape_options(labels_column, prompt_column or completion_column, chat_template, train_on,
                                 tokenizer is not None)
    if chosen is None:
        return None
    if labels_column:
        return FineTuneShape("labels", column=column or "input_ids", labels_column=labels_column, tokenizer=tokenizer)
    if chat_template:
        roles = tuple(train_on) if train_on else DEFAULT_TRAIN_ON
        return FineTuneShape("chat", column=column or "messages", train_on=roles, tokenizer=tokenizer,
                             template=load_chat_template(chat_template))
    return FineTuneShape("prompt_completion", prompt_column=prompt_column or "prompt",
                         completion_column=completion_column or "completion", tokenizer=tokenizer, eos_token=eos_token)


def recorded_shape(options: dict, tokenizer: str | None, chat_template: str | None, why: str) -> FineTuneShape:
    """Return the ``FineTuneShape`` a measured plan records (``options["fine_tune"]``), loaded again.

    ``tokenizer`` and ``chat_template`` are the files given to the job (checked by name, and by
    digest where the plan recorded one, against what the plan was measured with); ``why`` names
    what needs them in the error line.
    """
    from ..specs import load_tokenizer

    fine_tune = options.get("fine_tune") or {}
    if fine_tune.get("shape") == "labels":
        return shape_of_record(options, None, None, why)
    recorded = options.get("tokenizer")
    if not tokenizer:
        raise SortpackError(f"{why} needs --tokenizer (the tokenizer.json the plan was measured with"
                            f"{f': {recorded}' if recorded else ''})")
    check_recorded_file("--tokenizer", tokenizer, recorded, "the plan was measured with")
    check_recorded_tokenizer(tokenizer, fine_tune.get("tokenizer_sha256"))
    return shape_of_record(options, load_tokenizer(tokenizer, "--tokenizer"), chat_template, why)


def check_recorded_file(option: str, given: str, recorded: str | None, what: str) -> None:
    """Raise SortpackError unless ``given`` has the file name a manifest recorded (``recorded``; None: anything)."""
    if recorded and Path(given).name != Path(recorded).name:
        raise SortpackError(f"{option} {given}: {what} {Path(recorded).name!r}")


def check_recorded_tokenizer(given: str, digest: str | None) -> None:
    """Raise SortpackError unless the tokenizer file ``given`` has the bytes a plan recorded (``digest``; None:
    not recorded), so a tokenizer changed under the same name is blamed, not the input."""
    if digest and file_digest(given) != digest:
        raise SortpackError(f"--tokenizer {given}: not the tokenizer the plan was measured with (the file changed "
                            f"since: sha256 {file_digest(given)[:12]}..., the plan's {digest[:12]}...)")


def _recorded_template(fine_tune: dict, chat_template: str) -> ChatTemplate:
    """Return the chat template at ``chat_template``, checked against the one a plan's chats were rendered with."""
    check_recorded_file("--chat-template", chat_template, fine_tune.get("chat_template"),
                        "the plan's chats were rendered with")
    template = load_chat_template(chat_template)
    digest = fine_tune.get("template_sha256")
    if digest and template.digest != digest:
        raise SortpackError(f"--chat-template {chat_template}: not the template the plan's chats were rendered with "
                            f"(its text or special tokens changed since: sha256 {template.digest[:12]}..., the "
                            f"plan's {digest[:12]}...)")
    return template


def shape_of_record(options: dict, tokenizer: Any, chat_template: str | None, why: str | None) -> FineTuneShape:
    """Return the ``FineTuneShape`` of a plan's recorded analyze options with ``tokenizer`` (loaded) and the chat
    template at ``chat_template`` (checked by name and digest against the plan's).

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
            template = _recorded_template(fine_tune, chat_template)
        elif why is not None:
            raise SortpackError(f"{why} needs --chat-template (the template the chats were rendered with: "
                                f"{fine_tune.get('chat_template')})")
        return FineTuneShape("chat", column=options.get("column") or "messages", tokenizer=tokenizer,
                             template=template, train_on=tuple(fine_tune.get("train_on") or DEFAULT_TRAIN_ON))
    # a plan recorded before the TRL encoding (no "encoding") encoded its pairs with the pair template
    eos = fine_tune.get("eos_token") if fine_tune.get("encoding") == "trl" else None
    return FineTuneShape("prompt_completion", prompt_column=fine_tune.get("prompt_column") or "prompt",
                         completion_column=fine_tune.get("completion_column") or "completion", tokenizer=tokenizer,
                         eos_token=eos)


def read_labels(shape: FineTuneShape, files: list[dict], ids: np.ndarray, sizes: np.ndarray) -> pa.Array:
    """Return the labels (list<int32>, one row per id) of the samples ``ids``, read back from the plan's input
    ``files`` and encoded again with ``shape``.

    Only the input units that hold one of ``ids`` are read. Raises one line where a sample no
    longer measures its recorded ``sizes`` (the input changed since analyze: the tokenizer and
    the chat template were checked against the plan's digests before).
    """
    from ..pieces import read_sample_rows

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
