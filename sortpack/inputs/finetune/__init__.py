"""Fine-tuning inputs: token ids and their loss-target labels from the three dataset shapes SFT tools use.

A shape is one ``FineTuneShape`` subclass (``base.py``): the columns it reads, how it encodes
them, what a manifest records of it and how it comes back from that record; ``registry.SHAPES``
holds them by name:

- ``labels`` (``labels.LabelsShape``): a token-id list column with a ``labels`` list column
  aligned to it (-100: no target);
- ``prompt_completion`` (``pairs.PairsShape``): text columns encoded as TRL's ``SFTTrainer``
  encodes them (prompt + completion + the end-of-sequence token as one text; the completion's
  tokens, the end token among them, are the targets), or as a pair (``--pair-encoding pair``);
- ``chat`` (``chats.ChatShape``): a ``messages`` column of ``{role, content}`` rendered with the
  model's chat template (``template.py``; the ids ``transformers``' ``apply_chat_template(...,
  tokenize=True)`` gives); targets are the tokens of the ``train_on`` roles' turns, by default the
  assistant's (cut by the template family's rule where it marks nothing: ``families.py``).

A target is a position whose label is not -100; labels hold the token id there (Hugging Face's
convention, aligned to ``input_ids``: the model shifts them). Encoding works a batch at a time:
one ``encode_batch`` per batch and numpy for the label masks (``encoded.py``). ``read_back.py``
encodes a plan's samples again from its inputs.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# public name -> the module that holds it, imported when first asked for: the reader takes IGNORE_INDEX from
# here without loading the shapes, their templates or their registry
_WHERE = {
    "FineTuneShape": "base", "check_recorded_file": "base", "file_digest": "base",
    "DEFAULT_TRAIN_ON": "chats", "ChatShape": "chats", "encode_chats": "chats", "render_chats": "chats",
    "IGNORE_INDEX": "encoded", "Encoded": "encoded", "Rows": "encoded",
    "LabelsShape": "labels", "pretokenized": "labels",
    "PAIR_ENCODINGS": "pairs", "PairsShape": "pairs", "end_token": "pairs", "prompt_completion": "pairs",
    "read_labels": "read_back", "SHAPES": "registry", "fine_tune_shape": "registry", "shape_from_record": "registry",
    "ChatTemplate": "template", "load_chat_template": "template",
}
__all__ = ["ChatShape", "ChatTemplate", "DEFAULT_TRAIN_ON", "Encoded", "FineTuneShape", "IGNORE_INDEX",
           "LabelsShape", "PAIR_ENCODINGS", "PairsShape", "Rows", "SHAPES", "check_recorded_file", "encode_chats",
           "end_token", "file_digest", "fine_tune_shape", "load_chat_template", "pretokenized", "prompt_completion",
           "read_labels", "render_chats", "shape_from_record"]

if TYPE_CHECKING:
    from .base import FineTuneShape, check_recorded_file, file_digest
    from .chats import DEFAULT_TRAIN_ON, ChatShape, encode_chats, render_chats
    from .encoded import IGNORE_INDEX, Encoded, Rows
    from .labels import LabelsShape, pretokenized
    from .pairs import PAIR_ENCODINGS, PairsShape, end_token, prompt_completion
    from .read_back import read_labels
    from .registry import SHAPES, fine_tune_shape, shape_from_record
    from .template import ChatTemplate, load_chat_template


def __getattr__(name: str) -> Any:
    """Return public name ``name``, its module imported on first use (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
