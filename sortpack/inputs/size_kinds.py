"""The size kinds: the SPECs measured on the ``--column`` (``length``, ``bytes``, ``words``, ``tokens``) and the
media kinds that name their own column (``image_tokens``, ``image_patches``, ``image_count``, ``audio_frames``),
one row each.

A row of ``SIZE_KINDS`` is everything the package knows of a kind: how it is measured (a
column to an int64 count per row), the column types it takes, and what the ranges of
``--oversize split``'s pieces count (None: a sample of this kind is never cut). Being a row
without ``settings`` means reading the text column (analyze reads it, the columns check asks
for it); a row with ``settings`` is spelled ``KIND:COLUMN[...]`` and measures the column it
names with the settings its SPEC gives (``inputs.media``, docs/multimodal.md). The CLI's
help, the split check, the store and the reader ask the table, never a list of names.
Adding a size kind is adding its row.

Importing this module loads neither numpy nor pyarrow (``--help`` lists the kinds); the
measures import them when they run.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


class SizeKind(NamedTuple):
    """One size kind: its measure, the column types it takes, what a split piece's range counts."""

    # (column, tokenizer, special_tokens) -> int64 count per row; None when the column's type does not fit.
    # A kind with settings is called (column, its SPEC's settings, the input file the rows came from).
    measure: Callable[..., np.ndarray | None]
    takes: str  # the column types it measures, as a message names them
    # what --oversize split's piece ranges count: "values" (characters of a text, elements of a list,
    # bytes of a binary value), "bytes" (a text's UTF-8 bytes, cut at character boundaries), "tokens"
    # (the token ids); None: the kind says how large a sample is but not where to cut it
    ranges: str | None = None
    # a kind spelled KIND:REST: (REST, the option and SPEC for messages) -> (the column it names, its settings)
    settings: Callable[[str, str], tuple[str, Any]] | None = None
    spelling: str = ""  # how help spells a kind with settings

    @property
    def can_split(self) -> bool:
        """Return whether ``--oversize split`` can cut a sample measured in this kind."""
        return self.ranges is not None

    @property
    def cuts_column(self) -> bool:
        """Return whether a piece's range indexes the column's own values (else the token ids made from them)."""
        return self.ranges in ("values", "bytes")


def _numpy(arr: Any) -> np.ndarray:
    """Return an Arrow array or chunked array as an int64 numpy array."""
    import numpy as np
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _length(col: pa.ChunkedArray, tokenizer: Any = None, special_tokens: bool = True) -> np.ndarray | None:
    """Return the characters of a text, the bytes of a binary value or the elements of a list, per row."""
    from .. import arrow_compute as ac
    from ..arrow_types import is_binary, is_list, is_text

    if is_text(col.type):
        return _numpy(ac.utf8_length(col))
    if is_binary(col.type):
        return _numpy(ac.binary_length(col))
    if is_list(col.type):
        return _numpy(ac.list_value_length(col))
    return None


def _bytes(col: pa.ChunkedArray, tokenizer: Any = None, special_tokens: bool = True) -> np.ndarray | None:
    """Return the bytes of each text (UTF-8) or binary value."""
    from .. import arrow_compute as ac
    from ..arrow_types import is_binary, is_text

    return _numpy(ac.binary_length(col)) if is_text(col.type) or is_binary(col.type) else None


def _words(col: pa.ChunkedArray, tokenizer: Any = None, special_tokens: bool = True) -> np.ndarray | None:
    """Return the words of each text, as ``len(text.split())``."""
    import numpy as np

    from .. import arrow_compute as ac
    from ..arrow_types import is_text

    if not is_text(col.type):
        return None
    # utf8_split_whitespace splits on the same Unicode whitespace as str.split (RE2's \S takes
    # U+3000, U+00A0 and \v for word characters) and is about 2x faster than a regex count; it
    # leaves empty pieces around leading and trailing whitespace, which are not words.
    parts = [np.empty(0, np.int64)]
    for chunk in col.chunks:
        lists = ac.utf8_split_whitespace(chunk)
        starts = lists.offsets.to_numpy().astype(np.int64)
        words = ac.not_equal(ac.binary_length(lists.values), 0).to_numpy(zero_copy_only=False)
        before = np.concatenate(([0], np.cumsum(words, dtype=np.int64)))
        parts.append(before[starts[1:]] - before[starts[:-1]])
    return np.concatenate(parts)


def _tokens(col: pa.ChunkedArray, tokenizer: Any = None, special_tokens: bool = True) -> np.ndarray | None:
    """Return the token ids the tokenizer gives each text (with its special tokens when ``special_tokens``).

    Without a tokenizer, a list of integers is token ids already (a Megatron dataset's sequences):
    its length.
    """
    from ..arrow_types import is_text
    from .fast_tokens import token_ids

    if tokenizer is None and is_list_of_ids(col.type):
        return _length(col)
    return token_ids(tokenizer, col, special_tokens, keep=False)[1] if is_text(col.type) else None


def is_list_of_ids(t: pa.DataType) -> bool:
    """Return whether ``t`` is a list of integers: token ids as they are."""
    import pyarrow as pa

    from ..arrow_types import is_list

    return is_list(t) and pa.types.is_integer(t.value_type)


def _images(what: str) -> tuple[Callable[..., np.ndarray | None], Callable[[str, str], tuple[str, Any]]]:
    """Return the measure and the SPEC parser of the image kind counting ``what`` (count, tokens or patches)."""
    def measure(col: pa.ChunkedArray, settings: Any, source: str) -> np.ndarray | None:
        from .media.measure import measure_images

        return measure_images(col, settings, source)

    def parse(rest: str, where: str) -> tuple[str, Any]:
        from .media.settings import image_settings

        return image_settings(what)(rest, where)

    return measure, parse


def _audio_frames(col: pa.ChunkedArray, settings: Any, source: str) -> np.ndarray | None:
    """Return each row's audio duration in frames."""
    from .media.measure import measure_audio

    return measure_audio(col, settings, source)


def _audio_settings(rest: str, where: str) -> tuple[str, Any]:
    """Return (column, settings) of an ``audio_frames`` SPEC."""
    from .media.settings import audio_settings

    return audio_settings(rest, where)


_image_tokens, _image_tokens_spec = _images("tokens")
_image_patches, _image_patches_spec = _images("patches")
_image_count, _image_count_spec = _images("count")
_MEDIA = "a binary, path (string) or Hugging Face Image/Audio (struct) column, or a list column of them"
# the table: every size kind, in the order help and messages list them
SIZE_KINDS: dict[str, SizeKind] = {
    "length": SizeKind(_length, "a string, binary or list column", ranges="values"),
    "bytes": SizeKind(_bytes, "a string or binary column", ranges="bytes"),
    "words": SizeKind(_words, "a string column"),
    "tokens": SizeKind(_tokens, "a string column, or a list of token ids without --tokenizer", ranges="tokens"),
    "image_tokens": SizeKind(_image_tokens, _MEDIA, settings=_image_tokens_spec,
                             spelling="image_tokens:COL:SCHEME[:K=V,...]"),
    "image_patches": SizeKind(_image_patches, _MEDIA, settings=_image_patches_spec,
                              spelling="image_patches:COL:SCHEME[:K=V,...]"),
    "image_count": SizeKind(_image_count, _MEDIA, settings=_image_count_spec, spelling="image_count:COL"),
    "audio_frames": SizeKind(_audio_frames, _MEDIA, settings=_audio_settings, spelling="audio_frames:COL[*FPS]"),
}


def size_kind(spec: str | None) -> SizeKind | None:
    """Return the row of SPEC ``spec`` measured on ``--column`` (None: not such a size kind, e.g. ``column:NAME``,
    ``python:M:F`` or a media kind's ``image_tokens:COL:...``)."""
    return SIZE_KINDS.get(spec or "")


def reads_text(*specs: str | None) -> bool:
    """Return whether any of the SPECs is measured on the text column (is a size kind without settings)."""
    return any((kind := size_kind(s)) is not None and kind.settings is None for s in specs)


def spec_forms() -> tuple[str, ...]:
    """Return how help spells each size kind's SPEC, in the table's order."""
    return tuple(kind.spelling or name for name, kind in SIZE_KINDS.items())


def split_kinds() -> tuple[str, ...]:
    """Return the size kinds ``--oversize split`` can cut, in the table's order."""
    return tuple(name for name, kind in SIZE_KINDS.items() if kind.can_split)
