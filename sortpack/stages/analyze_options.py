"""What analyze measures (``AnalyzeOptions``): the column, the size and difficulty SPECs, the per-sample measures and
a fine-tuning shape; checked before any file is read, and recorded in manifests."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import SortpackError
from ..inputs.measures import measure_of, parse_measure, size_name
from ..inputs.size_kinds import reads_text
from ..inputs.specs import parse_spec

if TYPE_CHECKING:
    from ..inputs.finetune import FineTuneShape


@dataclass(frozen=True)
class AnalyzeOptions:
    """What to measure: the column and the size/difficulty SPECs (read-only: ``dataclasses.replace`` makes a copy)."""

    column: str | None = None
    size: str = "length"
    difficulty: str | None = None
    tokenizer: str | None = None
    input_format: str = "auto"
    special_tokens: bool = True  # tokens: count the ones the post-processor adds
    split: str | None = None  # the split of a Hugging Face DatasetDict directory
    size2: str | None = None  # --size2 SPEC: a second size per sample, the measure ``size2``
    sizes: tuple[str, ...] = ()  # the 2nd, 3rd.. --size2 SPEC: the measures size3, size4, ..
    # --measure NAME=SPEC and --cap NAME=SPEC:N: other measures (inputs/measures.py), by name
    measures: tuple[tuple[str, str], ...] = ()
    # fine-tuning data (inputs/finetune/): a labels column, prompt/completion texts or chats, and how to encode them
    shape: FineTuneShape | None = None

    def validate(self) -> None:
        """Raise SortpackError (one line) for options that cannot work, decided before any file is read: a SPEC
        that does not parse, an empty ``--size2``, a fine-tuning shape's options."""
        if self.size2 is not None and not self.size2.strip():
            raise SortpackError("--size2 '': expected a SPEC (the second size of each sample), or leave it out")
        column = self.column or "text"  # only the SPECs' syntax: the column may be found in the files later
        specs = [parse_spec(text, column, option) for option, text in
                 (("--size", self.size), ("--difficulty", self.difficulty)) if text]
        for name, text in self.measure_specs().items():  # --size2 and every --measure
            parse_spec(text, column, measure_of(name).option)
        if self.shape is None:
            return
        self.shape.validate(bool(self.tokenizer))
        if self.text_shape and self.size != "tokens":
            raise SortpackError(f"--size {self.size}: a prompt/completion or chat sample's size is its tokens "
                                "(leave --size out)")
        if self.text_shape and self.difficulty and reads_text(specs[1].kind):
            raise SortpackError(f"--difficulty {self.difficulty}: of fine-tuning texts, give a column: or python: "
                                "SPEC")

    def resolved(self) -> AnalyzeOptions:
        """Return these options with what the files they name decide, for the plan to record: a fine-tuning shape's
        (the digests of its tokenizer and chat template, the end token of TRL pairs).

        Raises SortpackError (one line) when pairs have no end token to append.
        """
        if self.shape is None:
            return self
        return dataclasses.replace(self, shape=self.shape.resolved(self.tokenizer))

    def measured(self) -> tuple[str, ...]:
        """Return the names of the per-sample measures a plan of these options carries beside its size."""
        return (*self.measure_specs(), *(("targets",) if self.shape is not None else ()))

    def measure_specs(self) -> dict[str, str]:
        """Return the SPEC of each per-sample measure to evaluate like a size, by measure name (SortpackError, one
        line: a ``--measure`` name it cannot take)."""
        given = dict(parse_measure(f"{name}={spec}") for name, spec in self.measures)
        sizes = {size_name(k + 1): spec for k, spec in enumerate(self.sizes)}
        return {**({"size2": self.size2} if self.size2 else {}), **sizes, **given}

    def __post_init__(self) -> None:
        """Give fine-tuning shapes their defaults: texts count tokens, a labels column labels ``input_ids``."""
        # a prompt/completion or chat sample's size is its tokens (length is only the default)
        if self.text_shape and self.size == "length":
            object.__setattr__(self, "size", "tokens")
        if self.shape is not None:  # a labels column's ids (the store cuts both at a split)
            object.__setattr__(self, "column", self.shape.plan_column(self.column))

    @property
    def text_shape(self) -> bool:
        """Return whether the samples are texts a tokenizer encodes (prompt/completion pairs, chats)."""
        return self.shape is not None and self.shape.encodes_text

    def fine_tune(self) -> dict | None:
        """Return the fine-tuning shape's options as manifests record them (None: not a fine-tuning shape)."""
        return self.shape.record() if self.shape is not None else None

    def as_dict(self) -> dict:
        """Return the options as recorded in manifests (tokenizer by file name only).

        ``special_tokens`` is recorded when a SPEC counts tokens and ``split`` when given,
        so the manifests of runs that use neither keep their content hash.
        """
        out: dict[str, Any] = {"column": self.column, "size": self.size, "difficulty": self.difficulty or self.size,
               "tokenizer": None if not self.tokenizer else str(self.tokenizer).rsplit("/", 1)[-1],
               "input_format": self.input_format}
        if "tokens" in (self.size, self.difficulty, self.size2, *self.sizes, *dict(self.measures).values()):
            out["special_tokens"] = self.special_tokens
        if self.split is not None:
            out["split"] = self.split
        if self.size2:
            out["size2"] = self.size2
        if self.sizes:  # recorded only when given: other plans keep their content hash
            out["sizes"] = list(self.sizes)
        if self.measures:  # recorded only when given: other plans keep their content hash
            out["measures"] = dict(self.measures)
        fine_tune = self.fine_tune()
        if fine_tune is not None:  # recorded only for fine-tuning data: other plans keep their content hash
            out["fine_tune"] = fine_tune
        return out
