"""Where a chat turn's targets begin and end when its template marks nothing (no ``{% generation %}`` blocks).

TRL trains a model family's chats with a marked training variant of the family's template; where
sortpack knows the family's own template (by its digest) it follows the variant's marks, which may
take the whitespace around a turn's content with it (Qwen 2.5's marks hold the ``\\n`` before the
answer and the one after ``<|im_end|>``). Any other template: a turn's targets run from its content
to its end-of-turn token, whitespace on either side left out (``CONTENT``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class TurnRule:
    """How a turn's target span is cut from the turn's text: from its content (``before``: and the whitespace just
    before it) to its end (``after``: and the whitespace after its end-of-turn token)."""

    name: str
    before: bool = False
    after: bool = False

    def span(self, text: str, turn: int, content: int) -> tuple[int, int]:
        """Return the target span of the turn ``text[turn:]`` (the last of ``text``) whose content starts at
        ``content``."""
        start = content
        if self.before:
            while start > turn and text[start - 1].isspace():
                start -= 1
        return start, len(text) if self.after else len(text.rstrip())


CONTENT = TurnRule("content")
WHITESPACE = TurnRule("whitespace", before=True, after=True)

# sha256 of a family's own template text -> (the family, the rule its marked training template follows)
FAMILIES: dict[str, tuple[str, TurnRule]] = {}


def template_digest(source: str) -> str:
    """Return the sha256 of a template's text (the key of ``FAMILIES``)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def turn_rule(source: str) -> tuple[str | None, TurnRule]:
    """Return the family whose own template ``source`` is (None: none known) and the rule its turns' targets follow."""
    family, rule = FAMILIES.get(template_digest(source), (None, CONTENT))
    return family, rule
