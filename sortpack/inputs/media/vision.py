"""The vision tokens a model's processor makes of an image of a given size, vectorised over images.

Three schemes, each a frozen record of the processor's settings with ``tokens`` (what the
language model sees) and ``patches`` (what the vision encoder sees), both int64 per image:

- ``Qwen2VL``: ``smart_resize`` (both sides rounded to multiples of ``patch_size * merge_size``,
  the pixels scaled into ``[min_pixels, max_pixels]``), then a grid of patches; every
  ``merge_size``² patches merge into one token. The arithmetic is transformers'
  ``qwen2_vl.image_processing_qwen2_vl.smart_resize`` step for step in float64, so the grid is
  the processor's ``image_grid_thw`` exactly.
- ``LlavaNext`` (any-res): ``select_best_resolution`` picks the pinpoint (height, width) that
  keeps the most of the image, the image is cut into ``tile``-pixel tiles of that canvas plus
  one base tile; the tokens are the processor's ``_get_number_of_features``: the unpadded
  feature grid, one newline per feature row, and the base tile's features.
- ``Patches``: a native-resolution ViT's ``ceil(w / p) * ceil(h / p)`` (``floor`` where the
  encoder drops a partial patch).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

# int(round(x, 7)) (LLaVA-NeXT's unpadding) rounds up exactly when x's fraction is above this decimal
_ROUND7 = Fraction(99999995, 10**8)
_ROUND7_FLOAT = float(_ROUND7)
_ROUND7_UP_AT_EQUAL = Fraction(_ROUND7_FLOAT) > _ROUND7


@dataclass(frozen=True)
class Qwen2VL:
    """Qwen2-VL's processor (also Qwen2.5-VL's; Qwen3-VL's with ``patch_size=16``): defaults from its
    published preprocessor_config.json."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 16384

    def grid(self, width: np.ndarray, height: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (grid_h, grid_w): the patches down and across of each image once resized."""
        factor = self.patch_size * self.merge_size
        h = np.asarray(height, np.float64)
        w = np.asarray(width, np.float64)
        h_bar = np.round(h / factor) * factor  # round half to even, as Python's round()
        w_bar = np.round(w / factor) * factor
        over = h_bar * w_bar > self.max_pixels
        under = ~over & (h_bar * w_bar < self.min_pixels)
        with np.errstate(divide="ignore", invalid="ignore"):
            beta = np.sqrt((h * w) / self.max_pixels)
            h_bar = np.where(over, np.maximum(factor, np.floor(h / beta / factor) * factor), h_bar)
            w_bar = np.where(over, np.maximum(factor, np.floor(w / beta / factor) * factor), w_bar)
            beta = np.sqrt(self.min_pixels / (h * w))
            h_bar = np.where(under, np.ceil(h * beta / factor) * factor, h_bar)
            w_bar = np.where(under, np.ceil(w * beta / factor) * factor, w_bar)
        return h_bar.astype(np.int64) // self.patch_size, w_bar.astype(np.int64) // self.patch_size

    def refused(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return which images the processor refuses: an aspect ratio over 200."""
        w = np.asarray(width, np.float64)
        h = np.asarray(height, np.float64)
        return np.maximum(w, h) / np.minimum(w, h) > 200

    def patches(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return the encoder's patches per image (the processor's ``image_grid_thw`` product, t = 1)."""
        gh, gw = self.grid(width, height)
        return gh * gw

    def tokens(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return the language model's image tokens per image (the patches merged ``merge_size``² to one)."""
        return self.patches(width, height) // (self.merge_size * self.merge_size)


# llava-hf/llava-v1.6-*: image_grid_pinpoints, as (height, width)
LLAVA_NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


@dataclass(frozen=True)
class LlavaNext:
    """LLaVA-NeXT's any-res tiling: defaults from llava-hf/llava-v1.6's processor (336-px tiles of 14-px patches,
    one CLS token the ``default`` feature strategy drops)."""

    pinpoints: tuple[tuple[int, int], ...] = LLAVA_NEXT_PINPOINTS
    tile: int = 336  # the crop size: a tile's side, and the base image's
    patch_size: int = 14
    cls: int = 1  # num_additional_image_tokens
    select: str = "default"  # vision_feature_select_strategy: "default" drops the CLS token, "full" keeps it

    def best_resolution(self, width: np.ndarray, height: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (height, width) of the pinpoint ``select_best_resolution`` picks for each image."""
        ow = np.asarray(width, np.int64)
        oh = np.asarray(height, np.int64)
        best_h, best_w = np.zeros_like(oh), np.zeros_like(ow)
        best_eff = np.zeros(len(ow), np.int64)
        best_waste = np.full(len(ow), np.inf)
        for ph, pw in self.pinpoints:
            scale = np.minimum(pw / ow, ph / oh)
            dw = np.trunc(ow * scale).astype(np.int64)
            dh = np.trunc(oh * scale).astype(np.int64)
            eff = np.minimum(dw * dh, ow * oh)
            waste = ph * pw - eff
            better = (eff > best_eff) | ((eff == best_eff) & (waste < best_waste))
            best_h, best_w = np.where(better, ph, best_h), np.where(better, pw, best_w)
            best_eff, best_waste = np.where(better, eff, best_eff), np.where(better, waste, best_waste)
        return best_h, best_w

    def _features(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return ``_get_number_of_features`` (before the feature strategy drops the CLS token)."""
        ow = np.asarray(width, np.int64)
        oh = np.asarray(height, np.int64)
        bh, bw = self.best_resolution(ow, oh)
        side = self.tile // self.patch_size
        cur_h, cur_w = side * (bh // self.tile), side * (bw // self.tile)
        wider = ow / oh > cur_w / cur_h
        new_h = _int_round7(oh * (cur_w / ow))
        new_w = _int_round7(ow * (cur_h / oh))
        cur_h = np.where(wider, cur_h - (cur_h - new_h) // 2 * 2, cur_h)
        cur_w = np.where(wider, cur_w, cur_w - (cur_w - new_w) // 2 * 2)
        return cur_h * cur_w + cur_h + side * side + self.cls

    def tokens(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return the language model's image tokens per image (the processor's count of ``<image>`` tokens)."""
        return self._features(width, height) - (1 if self.select == "default" else 0)

    def patches(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return the encoder's patches per image: every tile of the chosen canvas and the base image."""
        bh, bw = self.best_resolution(width, height)
        side = self.tile // self.patch_size
        return ((bh // self.tile) * (bw // self.tile) + 1) * side * side

    def refused(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return which images the processor refuses (none)."""
        return np.zeros(len(np.asarray(width)), bool)


def _int_round7(x: np.ndarray) -> np.ndarray:
    """Return Python's ``int(round(x, 7))`` of non-negative floats, exactly (numpy's round(x, 7) scales by 1e7)."""
    whole = np.floor(x)
    frac = x - whole  # exact for floats: no rounding
    up = frac >= _ROUND7_FLOAT if _ROUND7_UP_AT_EQUAL else frac > _ROUND7_FLOAT
    return whole.astype(np.int64) + up


@dataclass(frozen=True)
class Patches:
    """A native-resolution ViT: one token per ``patch_size`` square, a partial one padded (``ceil``) or dropped."""

    patch_size: int = 16
    round: str = "ceil"

    def tokens(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return the patches per image."""
        w = np.asarray(width, np.int64)
        h = np.asarray(height, np.int64)
        p = self.patch_size
        if self.round == "floor":
            return (w // p) * (h // p)
        return (-(-w // p)) * (-(-h // p))

    def patches(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return the patches per image (the tokens: one each)."""
        return self.tokens(width, height)

    def refused(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """Return which images the scheme refuses (none)."""
        return np.zeros(len(np.asarray(width)), bool)


SCHEMES = {"qwen2_vl": Qwen2VL, "llava_next": LlavaNext, "patches": Patches}
