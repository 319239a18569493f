"""Fine-tuning inputs: token ids and their loss-target labels from the three dataset shapes SFT tools use.

- ``labels``: a token-id list column with a ``labels`` list column aligned to it (-100: no target);
  ``labels.py``;
- ``prompt_completion``: text columns encoded as TRL's ``SFTTrainer`` encodes them (prompt +
  completion + the end-of-sequence token as one text; the completion's tokens, the end token among
  them, are the targets), or as a pair (``--pair-encoding pair``); ``pairs.py``;
- ``chat``: a ``messages`` column of ``{role, content}`` rendered with the model's chat template
  (``template.py``; the ids ``transformers``' ``apply_chat_template(..., tokenize=True)`` gives);
  targets are the tokens of the ``train_on`` roles' turns, by default the assistant's (``chats.py``,
  cut by the template family's rule where its template marks nothing: ``families.py``).

A target is a position whose label is not -100; labels hold the token id there (Hugging Face's
convention, aligned to ``input_ids``: the model shifts them). Encoding works a batch at a time:
one ``encode_batch`` per batch and numpy for the label masks (``encoded.py``). ``shape.py`` holds
the shape a dataset has, from the options or a plan's record.
"""
from __future__ import annotations

from .chats import DEFAULT_TRAIN_ON, encode_chats, render_chats
from .encoded import IGNORE_INDEX, Encoded, Rows
from .labels import pretokenized
from .pairs import PAIR_ENCODINGS, end_token, prompt_completion
from .shape import (
    SHAPES,
    FineTuneShape,
    check_recorded_file,
    check_shape_options,
    file_digest,
    fine_tune_shape,
    read_labels,
    recorded_shape,
    shape_of_record,
)
from .template import ChatTemplate, load_chat_template

__all__ = ["DEFAULT_TRAIN_ON", "IGNORE_INDEX", "PAIR_ENCODINGS", "SHAPES", "ChatTemplate", "Encoded",
           "FineTuneShape", "Rows", "check_recorded_file", "check_shape_options", "encode_chats", "end_token",
           "file_digest", "fine_tune_shape", "load_chat_template", "pretokenized", "prompt_completion", "read_labels",
           "recorded_shape", "render_chats", "shape_of_record"]
