"""The prompt/completion shape: two text columns, encoded as TRL's ``SFTTrainer`` encodes them (or as a pair).

``trl`` (the default): the prompt and the completion with the end-of-sequence token appended (unless it ends
with it already) are one text, encoded with the tokenizer's special tokens for one sequence (e.g. BOS in front);
the completion starts where the ids of the prompt encoded alone stop agreeing with those of the whole text
(TRL's ``common_prefix_length``: a token that merges across the boundary belongs to the completion). Its tokens,
the end token among them, are the targets: ``completion_only_loss``. ``pair`` (``--pair-encoding pair``): the
two encoded as a pair with the tokenizer's pair template, the targets from the completion's first token on, no
end token added (the convention of sentence-pair classifiers, kept for plans measured with it).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...arrow_types import is_text
from ...errors import SortpackError
from ..token_columns import surround
from .base import FineTuneShape
from .encoded import Encoded, Rows, checked_column, common_prefix, encoded, flat_ids, positions

PAIR_ENCODINGS = ("trl", "pair")
BATCH = 4096  # texts per encode_batch call


def texts(col, rows: Rows, name: str) -> list:
    """Return a text column's strings; one line naming the column (and the first null's row) when one is wrong."""
    return checked_column(col, rows, name, is_text, "text").to_pylist()


def config_token(tokenizer_path: str, key: str) -> str | None:
    """Return special token ``key`` (``eos_token``) of the ``tokenizer_config.json`` beside ``tokenizer_path`` (None:
    no such file or key), as ``transformers`` loads it with the tokenizer."""
    beside = Path(tokenizer_path).parent / "tokenizer_config.json"
    try:
        value = json.loads(beside.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, dict):  # an AddedToken as the file writes it
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def end_token(tokenizer_path: str | None, given: str | None) -> str:
    """Return the end-of-sequence token of prompt/completion pairs: ``--eos-token``, else the tokenizer's config's.

    Raises SortpackError (one line) when neither gives one: TRL appends it to every completion.
    """
    if given:
        return given
    found = config_token(tokenizer_path, "eos_token") if tokenizer_path else None
    if found is None:
        raise SortpackError(f"--prompt-column/--completion-column: the end-of-sequence token appended to each "
                            f"completion is unknown (no eos_token in a tokenizer_config.json beside "
                            f"{tokenizer_path}); give --eos-token TOKEN (e.g. </s>), or --pair-encoding pair")
    return found


def check_end_token(tokenizer, eos: str) -> None:
    """Raise SortpackError (one line) unless ``eos`` is one token of ``tokenizer`` (as TRL requires of its eos)."""
    if tokenizer.token_to_id(eos) is None:
        raise SortpackError(f"--eos-token {eos}: not a token of the tokenizer (the end-of-sequence token must be "
                            "one of its tokens)")


def _encode(tokenizer, batch: list):
    """Return ``tokenizers`` encodings of ``batch`` with the special tokens (no offsets needed)."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return encode(batch, add_special_tokens=True)


def _trl_batch(tokenizer, prompts: Sequence[str], completions: Sequence[str], eos: str):
    """Return (flat ids, target flags, counts) of one batch of pairs encoded as TRL does."""
    whole = [p + (c if c.endswith(eos) else c + eos) for p, c in zip(prompts, completions)]
    prompt_ids, prompt_counts = flat_ids(_encode(tokenizer, list(prompts)))
    ids, counts = flat_ids(_encode(tokenizer, whole))
    start = common_prefix(prompt_ids, prompt_counts, ids, counts)  # where each completion begins
    return ids, positions(counts) >= np.repeat(start, counts), counts


def _pair_batch(tokenizer, prompts: Sequence[str], completions: Sequence[str]):
    """Return (flat ids, target flags, counts) of one batch encoded with the tokenizer's pair template."""
    encs = _encode(tokenizer, list(zip(prompts, completions)))
    ids, counts = flat_ids(encs)
    # where each completion starts (its first token of sequence 1), its sample's length when empty
    first = np.fromiter((_first_of(e.sequence_ids, 1) for e in encs), dtype=np.int64, count=len(encs))
    first = np.where(first < 0, counts, first)
    return ids, positions(counts) >= np.repeat(first, counts), counts


def _first_of(seq: list, value: int) -> int:
    try:
        return seq.index(value)
    except ValueError:
        return -1


def _column_ids(encoder, col, special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
    """Return (flat ids, counts) of a string array: the compiled path over its buffers, else its texts."""
    got = encoder.encode_column(col, special_tokens=special_tokens)
    return got if got is not None else encoder.encode_texts(col.to_pylist(), special_tokens=special_tokens)


def _overlaps_itself(text: str) -> bool:
    return any(text[:k] == text[-k:] for k in range(1, len(text)))


def trl_columns(encoder, prompts, completions, eos: str) -> Encoded | None:
    """Return ``prompt_completion``'s TRL encoding of two string arrays in whole-column calls; None where this
    encoder cannot give it exactly (not tiktoken-exact, or ``eos`` is no added token or can overlap itself).

    ``eos`` is an added token, split out before the pre-tokenizer: the whole text's ids are the
    prefix, the ids of prompt + completion (its own trailing ``eos`` cut off), ``eos``, the suffix.
    """
    import pyarrow as pa

    from ... import arrow_compute as ac

    if getattr(encoder, "token_lengths", lambda: None)() is None or eos not in encoder.allowed or \
            _overlaps_itself(eos):
        return None
    prompts, completions = (c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                            for c in (prompts, completions))
    prompts, completions = (ac.cast(c, pa.string()) if pa.types.is_large_string(c.type) else c
                            for c in (prompts, completions))
    ends = ac.ends_with(completions, eos)
    body = ac.if_else(ends, ac.utf8_slice_codeunits(completions, 0, -len(eos)), completions)
    core, core_counts = _column_ids(encoder, ac.binary_join_element_wise(prompts, body, ""), False)
    ids, counts = surround(core, core_counts, encoder.prefix, (encoder.token_to_id(eos), *encoder.suffix))
    prompt_ids, prompt_counts = _column_ids(encoder, prompts, True)
    start = common_prefix(prompt_ids.astype(np.int64), prompt_counts, ids.astype(np.int64), counts)
    return encoded([ids.astype(np.int64)], [positions(counts) >= np.repeat(start, counts)], [counts])


def prompt_completion(tokenizer, prompts: Sequence[str], completions: Sequence[str], eos: str | None = None
                      ) -> Encoded:
    """Return the ``Encoded`` of prompt/completion pairs: with ``eos`` as TRL's ``SFTTrainer`` encodes them (one
    text, ``eos`` appended, targets from where the prompt's own ids stop), without it as the pair template does.
    """
    parts: tuple[list, list, list] = ([], [], [])
    for a in range(0, len(prompts), BATCH):
        p, c = prompts[a:a + BATCH], completions[a:a + BATCH]
        for part, value in zip(parts, _trl_batch(tokenizer, p, c, eos) if eos is not None
                               else _pair_batch(tokenizer, p, c)):
            part.append(value)
    return encoded(*parts)


@dataclass(frozen=True, eq=False, kw_only=True)
class PairsShape(FineTuneShape):
    """``--prompt-column``/``--completion-column``: prompt and completion texts, encoded as ``encoding`` says
    (``trl``: one text, ``eos_token`` appended; ``pair``: the pair template)."""

    name: ClassVar[str] = "prompt_completion"
    option: ClassVar[str] = "--prompt-column/--completion-column"

    prompt_column: str = "prompt"
    completion_column: str = "completion"
    encoding: str = "trl"
    eos_token: str | None = None  # trl: the end token appended to each completion (the tokenizer config's if None)

    def columns(self) -> list[str]:
        """Return the prompt and completion columns."""
        return [self.prompt_column, self.completion_column]

    def text_columns(self) -> list[str]:
        """Return both columns: they are texts."""
        return self.columns()

    def encode_rows(self, table, rows: Rows) -> Encoded:
        """Return the pairs encoded (``prompt_completion``)."""
        prompts, completions = (checked_column(table.column(c), rows, c, is_text, "text")
                                for c in (self.prompt_column, self.completion_column))
        eos = self._end()
        if eos is not None and self.encoder is not None:
            got = trl_columns(self.encoder, prompts, completions, eos)
            if got is not None:
                return got
        return prompt_completion(self.tokenizer, prompts.to_pylist(), completions.to_pylist(), eos)

    def _end(self) -> str | None:
        """Return the end token appended to each completion (None: the pair template's encoding)."""
        if self.encoding != "trl":
            return None
        if self.eos_token is None:
            raise SortpackError(f"{self.option}: the end-of-sequence token appended to each completion is unknown; "
                                "give eos_token (--eos-token)")
        return self.eos_token

    def record(self) -> dict:
        """Return the columns, the encoding (and the end token it appends) and the tokenizer's digest."""
        out: dict[str, Any] = {"shape": self.name, "prompt_column": self.prompt_column,
                               "completion_column": self.completion_column}
        out.update({"encoding": "trl", "eos_token": self.eos_token} if self.encoding == "trl" else {"encoding": "pair"})
        if self.tokenizer_sha256:
            out["tokenizer_sha256"] = self.tokenizer_sha256
        return out

    @classmethod
    def from_record(cls, record: dict, column: str | None) -> PairsShape:
        """Return the shape of a plan's record (recorded before the TRL encoding, without one: the pair template)."""
        encoding = record.get("encoding", "pair")
        return cls(prompt_column=record.get("prompt_column") or "prompt",
                   completion_column=record.get("completion_column") or "completion", encoding=encoding,
                   eos_token=record.get("eos_token") if encoding == "trl" else None,
                   tokenizer_sha256=record.get("tokenizer_sha256"))

    def validate(self, has_tokenizer: bool) -> None:
        """Refuse an unknown encoding, and an end token with the pair template (which places the special tokens)."""
        super().validate(has_tokenizer)
        if self.encoding not in PAIR_ENCODINGS:
            raise SortpackError(f"--pair-encoding {self.encoding!r}: expected {' or '.join(PAIR_ENCODINGS)}")
        if self.encoding == "pair" and self.eos_token is not None:
            raise SortpackError("--eos-token with --pair-encoding pair: the pair template places the special tokens "
                                "(leave --eos-token out, or use --pair-encoding trl)")
        if self.eos_token is not None and not self.eos_token:
            raise SortpackError("--eos-token '': expected the end-of-sequence token (e.g. </s>)")

    def resolved(self, tokenizer_path: str | None) -> PairsShape:
        """Return the shape with the tokenizer's digest and (trl) its end token: ``--eos-token``, else its config's."""
        out = super().resolved(tokenizer_path)
        assert isinstance(out, PairsShape)
        if self.encoding == "trl":
            out = dataclasses.replace(out, eos_token=end_token(tokenizer_path, self.eos_token))
        return out

    def loaded(self, tokenizer, chat_template: str | None = None, why: str | None = None) -> PairsShape:
        """Return the shape with ``tokenizer``, its end token checked to be one of its tokens."""
        out = super().loaded(tokenizer)
        assert isinstance(out, PairsShape)
        if self.encoding == "trl" and self.eos_token is not None and out.tokenizer is not None:
            # the encoder knows its added tokens without the Tokenizer parsed
            check_end_token(out.encoder if out.encoder is not None else out.tokenizer, self.eos_token)
        return out
