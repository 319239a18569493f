"""The fine-tuning shapes by name (``SHAPES``), a shape from the options that name it (``fine_tune_shape``) or from
what a plan recorded (``shape_from_record``)."""
from __future__ import annotations

from collections.abc import Sequence

from ...errors import SortpackError
from .base import FineTuneShape
from .chats import DEFAULT_TRAIN_ON, ChatShape
from .labels import LabelsShape
from .pairs import PairsShape

# fine_tune.shape in a manifest -> its class; a new shape is one FineTuneShape subclass added here
SHAPES: dict[str, type[FineTuneShape]] = {cls.name: cls for cls in (LabelsShape, PairsShape, ChatShape)}


def shape_from_record(record: dict | None, column: str | None) -> FineTuneShape | None:
    """Return the shape a manifest's ``options.fine_tune`` records (None: no fine-tuning shape); ``column`` is the
    plan's recorded ``--column``. Raises SortpackError (one line) for a shape this sortpack does not know."""
    if not record:
        return None
    cls = SHAPES.get(record.get("shape", ""))
    if cls is None:
        raise SortpackError(f"the plan's fine-tuning shape {record.get('shape')!r} is not one this sortpack knows "
                            f"({', '.join(SHAPES)})")
    return cls.from_record(record, column)


def fine_tune_shape(column: str | None, labels_column: str | None = None, prompt_column: str | None = None,
                    completion_column: str | None = None, chat_template: str | None = None,
                    train_on: Sequence[str] | None = None, tokenizer=None, eos_token: str | None = None,
                    pair_encoding: str | None = None) -> FineTuneShape | None:
    """Return the ``FineTuneShape`` the options name (None when they name none), raising SortpackError on a mix.

    ``--labels-column``: token ids (``column``, default ``input_ids``) with labels;
    ``--prompt-column``/``--completion-column``: prompt/completion texts (``pair_encoding``: trl,
    the default, appends ``eos_token`` to each completion as TRL does; pair: the pair template);
    ``--chat-template``: conversations (``column``, default ``messages``), ``train_on`` the roles
    that train. With ``tokenizer`` (a loaded one) the shape is ready to encode, and is a collate's
    ``tokenize=``; without, it is the options alone (a job loads what it names).
    """
    pairs = prompt_column or completion_column
    chosen = [o for o, v in (("--labels-column", labels_column), ("--prompt-column/--completion-column", pairs),
                             ("--chat-template", chat_template)) if v]
    if len(chosen) > 1:
        raise SortpackError(f"{' and '.join(chosen)} name different dataset shapes: give one")
    if train_on is not None and not chat_template:
        raise SortpackError("--train-on chooses the roles of a chat: it needs --chat-template")
    for option, value in (("--pair-encoding", pair_encoding), ("--eos-token", eos_token)):
        if value is not None and not pairs:
            raise SortpackError(f"{option} applies to prompt/completion pairs (--prompt-column, --completion-column)")
    shape: FineTuneShape | None = None
    if labels_column:
        shape = LabelsShape(labels_column=labels_column, column=column or "input_ids")
    elif chat_template:
        shape = ChatShape(chat_template=str(chat_template), column=column or "messages",
                          train_on=tuple(train_on) if train_on is not None else DEFAULT_TRAIN_ON)
    elif pairs:
        shape = PairsShape(prompt_column=prompt_column or "prompt", completion_column=completion_column or "completion",
                           encoding=pair_encoding or "trl", eos_token=eos_token)
    if shape is not None and tokenizer is not None:
        shape.validate(True)
        shape = shape.loaded(tokenizer)
    return shape
