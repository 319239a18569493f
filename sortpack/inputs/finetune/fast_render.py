"""Chats of a known family's own template rendered without Jinja: every conversation of a column at once.

Where a template is a family's own text (by its sha256, ``families.FAMILIES``) and its turn is
a fixed pattern (Llama 3: ``bos`` first, then ``<|start_header_id|>ROLE<|end_header_id|>\\n\\n
CONTENT|trim<|eot_id|>``; Qwen 2.5 without tools: the default system turn unless the first
message is one, then ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``), the messages of a ``messages``
column are laid out as slots (a special token's text, or a text built with ``pyarrow.compute``
over the flattened roles and contents) and the target spans come from the slots' byte lengths,
as ``chats._turn_spans`` finds them by rendering (``FastFamily.lead`` and ``tail`` are the
whitespace its ``TurnRule`` takes before the content and leaves at the turn's end). A
conversation the pattern does not cover (a null, a tool call, another key set, a role the
template renders otherwise, a content holding the marker's first character, no message) is
rendered by Jinja (``chats.encode_chats``); ``tests/inputs/test_finetune_fast.py`` proves the
two paths give the same ids and labels.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ... import arrow_compute as ac
from .encoded import segment_sums
from .families import TurnRule, turn_rule

# what str.strip() strips (Jinja's trim): Python's whitespace, which is not Arrow's
_WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
               "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_MARK_START = "\ue000"  # chats._MARKER's first character: a content holding it is found by Jinja's rendering
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


@dataclass
class Messages:
    """The flattened messages of the conversations a family's pattern renders (``ok``), in order."""

    ok: np.ndarray  # per conversation of the column: rendered here
    counts: np.ndarray  # messages per rendered conversation
    roles: pa.Array
    contents: pa.Array
    first: np.ndarray  # per message: the first of its conversation

    def keep(self, which: np.ndarray) -> Messages:
        """Return these messages with the rendered conversations where ``which`` (one per rendered conversation) is
        set; the others are left to Jinja."""
        ok = self.ok.copy()
        ok[np.flatnonzero(ok)[~which]] = False
        mine = np.repeat(which, self.counts)
        return Messages(ok, self.counts[which], ac.filter_where(self.roles, mine), ac.filter_where(self.contents, mine),
                        self.first[mine])


@dataclass
class Layout:
    """The rendered conversations as slots: per slot, a special token's text (None: a text slot), the texts (a
    string array per message, or None for a special slot) and where it is present (None: everywhere)."""

    messages: Messages
    specials: list[str | None]
    texts: list[pa.Array | None]
    present: list[np.ndarray | None]
    content_slot: int
    content_offset: np.ndarray  # per message: bytes in its content slot before the content
    rule: TurnRule
    lead: int  # whitespace bytes just before the content (all a before-rule takes back)
    tail: int | np.ndarray  # whitespace bytes ending every turn, or per message (what a rule without after leaves out)

    def byte_lengths(self) -> np.ndarray:
        """Return each message's slots' lengths in bytes (messages x slots, int64)."""
        n = len(self.messages.roles)
        out = np.zeros((n, len(self.specials)), np.int64)
        for w, (special, text, present) in enumerate(zip(self.specials, self.texts, self.present)):
            if special is not None:
                out[:, w] = len(special.encode("utf-8"))
            else:
                assert text is not None
                out[:, w] = ac.binary_length(text).to_numpy(zero_copy_only=False)
            if present is not None:
                out[~present, w] = 0
        return out

    def slot_text(self, w: int) -> pa.Array:
        """Return text slot ``w``'s text per message ("" where it is not present)."""
        text, present = self.texts[w], self.present[w]
        assert text is not None
        return text if present is None else ac.if_else(present, text, "")

    def text_column(self) -> pa.Array:
        """Return every conversation's rendered text (a string array): what Jinja renders."""
        m = len(self.messages.roles)
        parts = []
        for special, text, present in zip(self.specials, self.texts, self.present):
            part = pa.array(np.full(m, special), pa.string()) if special is not None else text
            parts.append(part if present is None else ac.if_else(present, part, ""))
        per_message = ac.binary_join_element_wise(*parts, "") if parts else pa.array([""] * m)
        offsets = np.concatenate(([0], np.cumsum(self.messages.counts))).astype(np.int32)
        return ac.binary_join(pa.ListArray.from_arrays(pa.array(offsets), per_message), "")


@dataclass(frozen=True)
class FastFamily:
    """A family whose own template renders each turn by a fixed pattern (``lay_out`` builds the slots)."""

    name: str
    roles: frozenset[str] | None  # the roles its pattern renders (None: any)
    lay_out: Callable[[Messages, dict], Layout | None]


def _constant(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


def _llama3(msgs: Messages, special: dict) -> Layout | None:
    bos = special.get("bos_token")
    if not isinstance(bos, str):
        return None
    body = ac.binary_join_element_wise("\n\n", ac.utf8_trim(msgs.contents, characters=_WHITESPACE), "")
    n = len(msgs.roles)
    return Layout(msgs, [bos, "<|start_header_id|>", None, "<|end_header_id|>", None, "<|eot_id|>"],
                  [None, None, msgs.roles, None, body, None], [msgs.first, None, None, None, None, None],
                  content_slot=4, content_offset=np.full(n, 2, np.int64), rule=turn_rule_of("llama3"), lead=2, tail=0)


def _qwen2_5(msgs: Messages, special: dict) -> Layout | None:
    n = len(msgs.roles)
    default = msgs.first & (ac.not_equal(msgs.roles, "system").to_numpy(zero_copy_only=False))
    head = ac.binary_join_element_wise(msgs.roles, msgs.contents, "\n")
    content_offset = ac.binary_length(msgs.roles).to_numpy(zero_copy_only=False).astype(np.int64) + 1
    return Layout(msgs, ["<|im_start|>", None, "<|im_end|>", None, "<|im_start|>", None, "<|im_end|>", None],
                  [None, _constant("system\n" + QWEN_SYSTEM, n), None, _constant("\n", n), None, head, None,
                   _constant("\n", n)], [default, default, default, default, None, None, None, None],
                  content_slot=5, content_offset=content_offset, rule=turn_rule_of("qwen2_5"), lead=1, tail=1)


@dataclass(frozen=True)
class MistralTurns:
    """How a Mistral template renders a turn: a user's ``OPEN[INST] [SYSTEM\n\n]CONTENT GAP[/INST]``, an
    assistant's ``ANSWER CONTENT</s>AFTER``, ``<s>`` first (``[INST]`` and ``[/INST]`` are special slots: added
    tokens in v0.3's vocabulary, plain text in v0.1's, which the encoder decides)."""

    user_open: str = ""
    close_gap: str = " "
    answer_open: str = ""
    after_eos: str = ""
    system: bool = False  # a first system message goes before the first user content (else: Jinja's to render)
    trim: bool = False  # an assistant's content is trimmed


def _mistral(turns: MistralTurns, family: str) -> Callable[[Messages, dict], Layout | None]:
    def lay_out(msgs: Messages, special: dict) -> Layout | None:
        bos, eos = special.get("bos_token"), special.get("eos_token")
        if not (isinstance(bos, str) and bos and isinstance(eos, str) and eos):
            return None
        n = len(msgs.roles)
        user = ac.equal(msgs.roles, "user").to_numpy(zero_copy_only=False)
        answer = ac.equal(msgs.roles, "assistant").to_numpy(zero_copy_only=False)
        system = msgs.first & ~user & ~answer  # the family's roles are these three
        starts = np.cumsum(msgs.counts) - msgs.counts
        conv = np.repeat(np.arange(len(msgs.counts)), msgs.counts)
        # the position among the turns after an opening system message: the templates raise unless they alternate
        at = np.arange(n) - starts[conv] - system[starts][conv]
        good = (user & (at % 2 == 0)) | (answer & (at % 2 == 1)) | (system & turns.system)
        whole = (segment_sums(~good, msgs.counts) == 0) & (msgs.counts > system[starts])
        if not whole.all():
            return lay_out(msgs.keep(whole), special)
        after_system = np.zeros(n, bool)
        after_system[1:] = system[:-1] & ~msgs.first[1:]
        before = ac.take(msgs.contents, pa.array(np.where(after_system, np.arange(n) - 1, np.arange(n)), pa.int64()))
        prefix = ac.if_else(after_system, ac.binary_join_element_wise(before, _constant("\n\n", n), ""), "")
        content = ac.if_else(answer, ac.utf8_trim(msgs.contents, characters=_WHITESPACE), msgs.contents) \
            if turns.trim else msgs.contents
        opener = ac.if_else(user, " ", turns.answer_open)
        head = ac.binary_join_element_wise(opener, prefix, content, "")
        prefix_bytes = ac.binary_length(prefix).to_numpy(zero_copy_only=False).astype(np.int64)
        offset = np.where(user, 1 + prefix_bytes, np.where(answer, len(turns.answer_open.encode("utf-8")), 0))
        return Layout(msgs, [bos, None, "[INST]", None, None, "[/INST]", eos, None],
                      [None, _constant(turns.user_open, n), None, head, _constant(turns.close_gap, n), None, None,
                       _constant(turns.after_eos, n)],
                      [msgs.first, user, user, user | answer, user, user, answer, answer],
                      content_slot=3, content_offset=offset, rule=turn_rule_of(family), lead=0,
                      tail=np.where(answer, len(turns.after_eos.encode("utf-8")), 0))

    return lay_out


FAST_FAMILIES = {
    "llama3": FastFamily("llama3", None, _llama3),
    "qwen2_5": FastFamily("qwen2_5", frozenset({"system", "user", "assistant"}), _qwen2_5),
}
_MISTRAL = {
    "mistral_v0_1": MistralTurns(after_eos=" "),
    "mixtral": MistralTurns(),
    "mistral_v0_2": MistralTurns(user_open=" ", answer_open=" ", system=True),
    "mistral_v0_3": MistralTurns(close_gap="", answer_open=" ", trim=True),
}
FAST_FAMILIES.update({name: FastFamily(name, frozenset({"system", "user", "assistant"}), _mistral(turns, name))
                      for name, turns in _MISTRAL.items()})


def turn_rule_of(family: str) -> TurnRule:
    """Return the turn rule ``families.FAMILIES`` gives ``family``."""
    from .families import FAMILIES

    return next(rule for name, rule in FAMILIES.values() if name == family)


def fast_family(template) -> FastFamily | None:
    """Return the family whose pattern renders ``template`` (a ``ChatTemplate``) without Jinja, None: none does."""
    family = turn_rule(template.source)[0]
    return FAST_FAMILIES.get(family) if family is not None else None


def _strings(arr: pa.Array) -> pa.Array | None:
    if pa.types.is_large_string(arr.type):
        return ac.cast(arr, pa.string())
    return arr if pa.types.is_string(arr.type) else None


def messages_of(col, roles: frozenset[str] | None) -> Messages | None:
    """Return the messages of the conversations of ``col`` the pattern renders (None: no list of {role, content}
    structs, so Jinja renders all)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or \
            not pa.types.is_struct(col.type.value_type):
        return None
    struct = ac.list_flatten(col)
    names = [f.name for f in struct.type]
    if "role" not in names or "content" not in names:
        return None
    fields = dict(zip(names, struct.flatten()))  # a null message's fields are null
    role, content = _strings(fields.pop("role")), _strings(fields.pop("content"))
    if role is None or content is None:
        return None
    good = np.asarray(ac.is_valid(struct)) & np.asarray(ac.is_valid(role)) & np.asarray(ac.is_valid(content))
    for other in fields.values():  # a tool call, a reasoning text, a name: Jinja's to render
        good &= np.asarray(ac.is_null(other))
    good &= ac.fill_null(ac.binary_length(role), 0).to_numpy(zero_copy_only=False) > 0
    if roles is not None:
        good &= np.asarray(ac.fill_null(ac.is_in(role, pa.array(sorted(roles))), False))
    good &= ~np.asarray(ac.fill_null(ac.match_substring(content, _MARK_START), True))
    lengths = ac.fill_null(ac.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    ok = np.asarray(ac.is_valid(col)) & (lengths > 0) & (segment_sums(~good, lengths) == 0)
    keep = np.repeat(ok, lengths)
    counts = lengths[ok]
    first = np.zeros(int(counts.sum()), bool)
    first[np.cumsum(counts) - counts] = True
    return Messages(ok, counts, ac.filter_where(role, keep), ac.filter_where(content, keep), first)


def render_layout(template, col) -> tuple[str, Layout] | None:
    """Return (the family, the layout) of the conversations of ``col`` that ``template``'s family pattern renders;
    None where no pattern renders the template (Jinja renders every conversation)."""
    family = fast_family(template)
    if family is None:
        return None
    msgs = messages_of(col, family.roles)
    if msgs is None:
        return None
    layout = family.lay_out(msgs, template.special_tokens)
    return (family.name, layout) if layout is not None else None


def render_column(template, col) -> tuple[np.ndarray, pa.Array] | None:
    """Return (which conversations of ``col`` are rendered here, their texts) as Jinja renders them; None where no
    family pattern renders ``template``."""
    got = render_layout(template, col)
    if got is None:
        return None
    layout = got[1]
    return layout.messages.ok, layout.text_column()
