"""Where a chat turn's targets begin and end when its template marks nothing (no ``{% generation %}`` blocks).

TRL trains a model family's chats with a marked training variant of the family's template; where
sortpack knows the family's own template (by its digest) it follows the variant's marks: Qwen 2.5's
hold the ``\\n`` before the answer and the one after ``<|im_end|>`` (``WHITESPACE``), Qwen 3's,
Gemma 3's and LFM2's the line end after the end-of-turn token (``END_LINE``), DeepSeek's the
assistant's header token too (``WHOLE_TURN``), Llama 3's and Cohere's the content and the
end-of-turn token alone (``CONTENT``). Any other template: ``CONTENT``, a turn's targets from its
content to its end-of-turn token, whitespace on either side left out.
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
    header: bool = False  # the turn's header (its role's tokens) too: from where the turn starts

    def span(self, text: str, turn: int, content: int) -> tuple[int, int]:
        """Return the target span of the turn ``text[turn:]`` (the last of ``text``) whose content starts at
        ``content``."""
        start = turn if self.header else content
        if self.before:
            while start > turn and text[start - 1].isspace():
                start -= 1
        return start, len(text) if self.after else len(text.rstrip())


CONTENT = TurnRule("content")
WHITESPACE = TurnRule("whitespace", before=True, after=True)
END_LINE = TurnRule("end_line", after=True)
WHOLE_TURN = TurnRule("whole_turn", header=True)
RULES = (CONTENT, WHITESPACE, END_LINE, WHOLE_TURN)

# sha256 of a family's own template text (as its models ship it) -> (the family, the rule its marked training
# template follows: TRL's ``<family>_training.jinja``, checked in tests/inputs/test_finetune_chats.py)
FAMILIES: dict[str, tuple[str, TurnRule]] = {
    "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f": ("qwen2_5", WHITESPACE),
    "a0bc6f6fc7a29a80017a433e8f03a1cc1236e838a944a2d034295a60c4f2fddb": ("qwen2_5_vl", END_LINE),
    "64f85b198065d0fba2a81f37e10ed68161ce2c19a754c7100e67e0ca2ee9c326": ("qwen3_instruct_2507", END_LINE),
    "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4": ("qwen3_vl", END_LINE),
    "7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4": ("gemma3", END_LINE),
    "cef187400d62a59507aab3a642ea9a8d2a2ef263562bc3430560e116945273cf": ("lfm2", END_LINE),
    "5504d163d879bfb6fd4135b7fa3d56768b2e69dd718338f7b146750289f46ab0": ("lfm2_v2", END_LINE),
    "56a1447ad31926fdc21fb07e56e5642bd9c850c4f52d8c8af7bbe5f079a84f5f": ("deepseek_r1_distill", WHOLE_TURN),
    "563b1ce7d61d50a9b4c7439a912a1116f095b712df5b5e4d3e1116049874eb64": ("deepseekv3", WHOLE_TURN),
    "cfc67e5f349f37690dfd31ed1f18bc4442a9dd32fe39a648f993cb4eb3cae678": ("muse_glimmer", WHOLE_TURN),
    "ba03a121d097859c7b5b9cd03af99aafe95275210d2876f642ad9929a150f122": ("llama3", CONTENT),
    "90c33aee14aa2a226127516d48ee9184c9b90745d4a04c484621ec2e82fb712c": ("cohere", CONTENT),
    "2147c474f41b522b7296f74692b9f31e45f49a31465960576a9d321339c5915a": ("cohere2", CONTENT),
    # Mistral's own templates (TRL has no training variant of them: the rule any template gets), known so that
    # fast_render lays them out: 7B v0.1 and Mixtral at release, v0.1/v0.2 today, v0.3 (benchmarks/real_templates.py)
    "7e995b379ec01747807246483647cd99030abf331653f1119e16d7ac041a3495": ("mistral_v0_1", CONTENT),
    "26a59556925c987317ce5291811ba3b7f32ec4c647c400c6cc7e3a9993007ba7": ("mixtral", CONTENT),
    "796853172235ab3aaa4810013ddfe2eab481bda3306dad4f700c00d436eed596": ("mistral_v0_2", CONTENT),
    "e16746b40344d6c5b5265988e0328a0bf7277be86f1c335156eae07e29c82826": ("mistral_v0_3", CONTENT),
}


def template_digest(source: str) -> str:
    """Return the sha256 of a template's text (the key of ``FAMILIES``)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def turn_rule(source: str) -> tuple[str | None, TurnRule]:
    """Return the family whose own template ``source`` is (None: none known) and the rule its turns' targets follow."""
    family, rule = FAMILIES.get(template_digest(source), (None, CONTENT))
    return family, rule
