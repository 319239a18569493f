"""A model's chat template: loaded from a ``tokenizer_config.json`` or a Jinja file (checked to be one), rendered in
the sandboxed Jinja environment ``transformers`` renders chat templates in, ``{% generation %}`` blocks tracked."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import SortpackError, one_line
from .families import turn_rule

# what transformers passes a chat template from the tokenizer's special tokens (its SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_SUFFIXES = (".jinja", ".j2", ".jinja2")
_YAML_KEY = re.compile(r"^[A-Za-z_][\w.-]*\s*:(\s*[|>][-+]?)?\s*$")  # a YAML mapping's first line: `chat_template: |`
# a job loads its template in several places (the plan's digests, the analysis, the store): a text is checked and
# compiled once per process (the tracker is per thread, so instances can share it)
_CHECKED: set[str] = set()
_COMPILED: dict[str, tuple[Any, Any]] = {}


class _Tracker(threading.local):
    """The spans of ``{% generation %}`` blocks rendered so far (per thread), None while not tracking."""

    blocks: list | None = None
    spans: list | None = None


def _globals(env) -> None:
    """Give ``env`` the globals transformers gives a chat template's environment (its own ``dict`` and
    ``namespace``, which refuse what would reach Python's internals) and its ``tojson`` filter."""
    import datetime

    import jinja2
    import jinja2.utils

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' filter: Jinja's own escapes HTML characters
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):
        """``namespace(...)``: names starting with an underscore refused."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r} on a namespace")

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.globals["dict"] = lambda *args, **kwargs: dict(*args, **kwargs)
    env.globals["namespace"] = Namespace


def _environment(tracker: _Tracker):
    """Return the Jinja environment transformers renders chat templates in, ``{% generation %}`` tracked."""
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

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    _globals(env)
    return env


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
        return re.search(r"\{%-?\s*generation\s*-?%\}", self.source) is not None

    @property
    def digest(self) -> str:
        """Return the sha256 of what renders a chat: the template's text and its special tokens."""
        text = json.dumps([self.source, dict(sorted(self.special_tokens.items()))], ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def _template(self):
        if self._compiled is None:
            known = _COMPILED.get(self.source)
            if known is None:
                import jinja2

                tracker = _Tracker()
                try:
                    known = _environment(tracker).from_string(self.source), tracker
                except jinja2.TemplateError as exc:
                    raise SortpackError(f"--chat-template {self.name}: not a Jinja template "
                                        f"({one_line(exc)})") from None
                _COMPILED[self.source] = known
            self._compiled, self._tracker = known
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


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # an AddedToken as tokenizer_config.json writes it
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_text(path: Path, what: str) -> str:
    """Return a file's text; one line when it cannot be read or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SortpackError(f"--chat-template {what}: cannot read ({one_line(exc)})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SortpackError(f"--chat-template {what}: not UTF-8 text (byte {data[exc.start]:#04x} at offset "
                            f"{exc.start}); a chat template is a tokenizer_config.json or a Jinja file") from None


def _config_template(config: dict, where: str) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise SortpackError(f"--chat-template {where}: chat_template is not a string")
    return template


def _from_config(path: Path, text: str) -> tuple[str, dict]:
    """Return the template and the config of a ``tokenizer_config.json`` (or the ``chat_template.jinja`` beside it)."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise SortpackError(f"--chat-template {path}: not JSON ({one_line(exc)})") from None
    if not isinstance(config, dict):
        raise SortpackError(f"--chat-template {path}: not a tokenizer_config.json (an object)")
    source = _config_template(config, str(path))
    if source is None and (path.parent / "chat_template.jinja").is_file():
        source = _read_text(path.parent / "chat_template.jinja", str(path.parent / "chat_template.jinja"))
    if source is None:
        raise SortpackError(f"--chat-template {path}: no chat_template in it (nor a chat_template.jinja beside it)")
    return source, config


def _check_file(path: Path, text: str) -> None:
    """Refuse a file that is no Jinja template: a YAML or JSON document rendered as one would put its own text in
    every chat."""
    first = next((line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")), "")
    if path.suffix.lower() in (".yaml", ".yml") or (path.suffix.lower() not in TEMPLATE_SUFFIXES
                                                     and _YAML_KEY.match(first.strip())):
        raise SortpackError(f"--chat-template {path}: a YAML file, not a chat template; give the model's "
                            "tokenizer_config.json or its chat template as a .jinja file")
    if first.lstrip().startswith(("{\"", "[")) and path.suffix.lower() not in TEMPLATE_SUFFIXES:
        raise SortpackError(f"--chat-template {path}: looks like JSON; name a tokenizer_config.json *.json")


def check_source(source: str, name: str) -> None:
    """Raise SortpackError (one line) unless ``source`` is a Jinja template a chat can be rendered with: it parses,
    reads ``messages``, and loads no other template (``{% include %}``, ``{% import %}``, ``{% extends %}``:
    ``transformers`` renders a chat template alone, without a loader)."""
    if source in _CHECKED:
        return
    import jinja2
    import jinja2.meta
    import jinja2.nodes

    env = _environment(_Tracker())
    try:
        tree = env.parse(source)
    except jinja2.TemplateError as exc:
        raise SortpackError(f"--chat-template {name}: not a Jinja template ({one_line(exc)})") from None
    loads = {jinja2.nodes.Include: "include", jinja2.nodes.Import: "import", jinja2.nodes.FromImport: "from ... import",
             jinja2.nodes.Extends: "extends"}
    for node_type, tag in loads.items():
        node = next(tree.find_all(node_type), None)
        if node is not None:
            raise SortpackError(f"--chat-template {name}: line {node.lineno} uses {{% {tag} %}}, which loads another "
                                "template; a chat template is rendered alone (as transformers renders it)")
    try:  # it compiles the tree, which finds what parsing does not (a filter or test the environment lacks)
        names = jinja2.meta.find_undeclared_variables(tree)
    except jinja2.TemplateError as exc:
        raise SortpackError(f"--chat-template {name}: not a Jinja template ({one_line(exc)})") from None
    if "messages" not in names:
        raise SortpackError(f"--chat-template {name}: never reads messages, so it is no chat template (a Jinja file "
                            "that renders the conversation `messages`, or a tokenizer_config.json)")
    _CHECKED.add(source)


def load_chat_template(path: str | Path) -> ChatTemplate:
    """Return the ``ChatTemplate`` of a Hugging Face ``tokenizer_config.json`` or a Jinja file, checked to be one.

    A JSON file gives its ``chat_template`` (or the ``chat_template.jinja`` beside it) and its
    special tokens; a Jinja file takes its special tokens from a ``tokenizer_config.json`` in
    the same directory, when there is one. Raises SortpackError (one line) for a file that is
    not UTF-8, not a template (a YAML file, a text that never reads ``messages``), or that loads
    other templates.
    """
    path = Path(path)
    text = _read_text(path, str(path))
    config: dict = {}
    if path.suffix == ".json":
        source, config = _from_config(path, text)
    else:
        _check_file(path, text)
        source = text
        beside = path.parent / "tokenizer_config.json"
        if beside.is_file():
            try:
                config = json.loads(beside.read_text(encoding="utf-8"))
            except ValueError:
                config = {}
            config = config if isinstance(config, dict) else {}
    special = {k: v for k in SPECIAL_KEYS if (v := _token_text(config.get(k))) is not None}
    template = ChatTemplate(source, special, path.name)
    if turn_rule(source)[0] is None:
        # checked and compiled here, so an error is reported now; a known family's own text (its digest) is one the
        # tests render, and its conversations are laid out without Jinja: compiled only if some are left to it
        check_source(source, path.name)
        template._template()
    return template
