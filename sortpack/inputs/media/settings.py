"""The SPECs of the media size kinds: ``KIND:COLUMN[*SCALE][:SCHEME][:KEY=VALUE,...]``, parsed to frozen settings.

- ``image_count:COL[:root=DIR]``: the images of each sample.
- ``image_tokens:COL:SCHEME[:KEY=VALUE,...]``: the vision tokens the language model sees, summed over a
  sample's images; ``image_patches:COL:SCHEME[...]``: the patches its vision encoder sees. SCHEME is
  ``qwen2_vl`` (patch_size, merge_size, min_pixels, max_pixels), ``llava_next`` (pinpoints as
  ``HxW+HxW+...``, tile, patch_size, cls, select=default|full) or ``patches`` (patch_size,
  round=ceil|floor); every scheme takes ``root=DIR``.
- ``audio_frames:COL[*FPS][:root=DIR]``: the audio's duration in frames of ``1/FPS`` s, rounded up
  (FPS 100 when left out: a 10 ms hop).

``root`` is the directory (or ``s3://``/``gs://`` prefix) relative paths in the column are under;
by default the directory of the input file that holds the row.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any

from ...errors import SortpackError
from .vision import SCHEMES, LlavaNext, Patches, Qwen2VL

_COLUMN = re.compile(r"^([^*:]+)(?:\*([0-9.eE+-]+))?$")


@dataclass(frozen=True)
class ImageSettings:
    """What an image size kind counts: ``count``, ``tokens`` or ``patches`` (of ``scheme``), and the paths' root."""

    what: str
    scheme: Qwen2VL | LlavaNext | Patches | None = None
    root: str | None = None


@dataclass(frozen=True)
class AudioSettings:
    """The frames per second an audio size counts (an exact fraction), and the paths' root."""

    fps: Fraction = Fraction(100)
    root: str | None = None


def _pairs(text: str, where: str) -> dict[str, str]:
    """Return the ``KEY=VALUE,...`` settings of ``text`` (empty: none)."""
    out: dict[str, str] = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key or not value:
            raise SortpackError(f"{where}: expected KEY=VALUE settings, got {item!r}")
        if key in out:
            raise SortpackError(f"{where}: {key} given twice")
        out[key] = value
    return out


def _column(text: str, where: str, scaled: bool) -> tuple[str, str | None]:
    """Return (the column, the scale text or None) of the SPEC part ``COL[*SCALE]``."""
    m = _COLUMN.match(text)
    if m is None or (m.group(2) is not None and not scaled):
        raise SortpackError(f"{where}: expected a column name{'[*FPS]' if scaled else ''} after the kind")
    return m.group(1), m.group(2)


def _number(key: str, value: str, where: str) -> int:
    """Return a positive integer setting."""
    if not value.isdigit() or int(value) <= 0:
        raise SortpackError(f"{where}: {key} must be a positive integer, got {value!r}")
    return int(value)


def _pinpoints(value: str, where: str) -> tuple[tuple[int, int], ...]:
    """Return LLaVA-NeXT's pinpoints from ``HxW+HxW+...``."""
    out = []
    for item in value.split("+"):
        h, x, w = item.partition("x")
        if not x or not h.isdigit() or not w.isdigit() or int(h) <= 0 or int(w) <= 0:
            raise SortpackError(f"{where}: pinpoints are HEIGHTxWIDTH joined by '+', got {item!r}")
        out.append((int(h), int(w)))
    return tuple(out)


_CHOICES = {"select": ("default", "full"), "round": ("ceil", "floor")}


def _scheme(name: str, given: dict[str, str], where: str) -> Qwen2VL | LlavaNext | Patches:
    """Return the scheme ``name`` with the settings ``given`` (every key one of its fields)."""
    if name not in SCHEMES:
        raise SortpackError(f"{where}: unknown scheme {name!r} (expected {', '.join(SCHEMES)})")
    scheme: Any = SCHEMES[name]()
    known = {f.name for f in fields(scheme)}
    values: dict[str, Any] = {}
    for key, value in given.items():
        if key not in known:
            raise SortpackError(f"{where}: {name} has no setting {key!r} (its settings: {', '.join(sorted(known))}, "
                                "root)")
        if key == "pinpoints":
            values[key] = _pinpoints(value, where)
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise SortpackError(f"{where}: {key} is one of {', '.join(_CHOICES[key])}, got {value!r}")
            values[key] = value
        else:
            values[key] = _number(key, value, where)
    scheme = replace(scheme, **values)
    if isinstance(scheme, Qwen2VL) and scheme.min_pixels > scheme.max_pixels:
        raise SortpackError(f"{where}: min_pixels {scheme.min_pixels} is over max_pixels {scheme.max_pixels}")
    if isinstance(scheme, LlavaNext) and any(h % scheme.tile or w % scheme.tile for h, w in scheme.pinpoints):
        raise SortpackError(f"{where}: every pinpoint must be whole tiles of {scheme.tile} px")
    return scheme


def image_settings(what: str):
    """Return the SPEC parser of the image kind counting ``what`` (``count``, ``tokens`` or ``patches``)."""
    def parse(rest: str, where: str) -> tuple[str, ImageSettings]:
        column_text, _, tail = rest.partition(":")
        column, _ = _column(column_text, where, scaled=False)
        if what == "count":
            given = _pairs(tail, where)
            if set(given) - {"root"}:
                raise SortpackError(f"{where}: image_count takes only root=DIR")
            return column, ImageSettings(what, None, given.get("root"))
        name, _, pairs = tail.partition(":")
        if not name:
            raise SortpackError(f"{where}: name the processor's scheme after the column ({', '.join(SCHEMES)})")
        given = _pairs(pairs, where)
        root = given.pop("root", None)
        return column, ImageSettings(what, _scheme(name, given, where), root)

    return parse


def audio_settings(rest: str, where: str) -> tuple[str, AudioSettings]:
    """Return (column, settings) of ``audio_frames:COL[*FPS][:root=DIR]``'s part after the kind."""
    column_text, _, tail = rest.partition(":")
    column, scale = _column(column_text, where, scaled=True)
    fps = Fraction(100)
    if scale is not None:
        try:
            fps = Fraction(scale)
        except (ValueError, ZeroDivisionError):
            raise SortpackError(f"{where}: bad frames per second {scale!r}") from None
        if fps <= 0:
            raise SortpackError(f"{where}: frames per second must be positive")
    given = _pairs(tail, where)
    if set(given) - {"root"}:
        raise SortpackError(f"{where}: audio_frames takes only root=DIR")
    return column, AudioSettings(fps, given.get("root"))
