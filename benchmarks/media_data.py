"""Generated media for bench_media and the media tests: images of many sizes, formats and modes (Pillow), audio
(wave, soundfile)."""
from __future__ import annotations

import io
import wave

import numpy as np

# (format, save options) cycled through: baseline and progressive JPEG, JPEG with EXIF and a large ICC profile
# before its frame header, PNG, WebP lossy, lossless, with alpha (VP8X) and animated, GIF static and animated
KINDS = ("png", "jpeg", "jpeg_progressive", "jpeg_exif_icc", "webp", "webp_lossless", "webp_alpha", "webp_anim",
         "gif", "gif_anim", "png_16bit", "jpeg_cmyk")


def _size(rng: np.random.Generator) -> tuple[int, int]:
    """Return a (width, height): real resolutions, tiny images, 28-px multiples and long thin ones."""
    pick = rng.integers(0, 4)
    if pick == 0:
        return int(rng.integers(1, 40)), int(rng.integers(1, 40))
    if pick == 1:
        return int(rng.integers(8, 49)) * 28, int(rng.integers(8, 49)) * 28
    if pick == 2:
        side = int(rng.integers(2, 30))
        long = side * int(rng.integers(20, 150))
        return (long, side) if rng.integers(0, 2) else (side, long)
    return int(np.exp(rng.uniform(np.log(16), np.log(2200)))), int(np.exp(rng.uniform(np.log(16), np.log(2200))))


def _icc(n: int) -> bytes:
    """Return a (fake) ICC profile of ``n`` bytes: JPEG stores it in APP2 segments before the frame header."""
    return bytes(np.arange(n, dtype=np.uint32).astype(np.uint8))


def encode(kind: str, width: int, height: int, seed: int = 0) -> bytes:
    """Return an image of ``width`` x ``height`` encoded as ``kind`` (one of KINDS)."""
    from PIL import Image

    color = (seed * 37 % 256, seed * 91 % 256, seed * 13 % 256)
    out = io.BytesIO()
    if kind in ("png", "gif"):
        Image.new(["RGB", "L", "RGBA", "P"][seed % 4], (width, height), color[0] if seed % 4 in (1, 3) else color
                  ).save(out, kind.upper())
    elif kind == "png_16bit":
        Image.new("I;16", (width, height), seed).save(out, "PNG")
    elif kind == "jpeg":
        Image.new(["RGB", "L"][seed % 2], (width, height), color if seed % 2 == 0 else color[0]).save(out, "JPEG")
    elif kind == "jpeg_cmyk":
        Image.new("CMYK", (width, height), (*color, 7)).save(out, "JPEG")
    elif kind == "jpeg_progressive":
        Image.new("RGB", (width, height), color).save(out, "JPEG", progressive=True, quality=85)
    elif kind == "jpeg_exif_icc":
        im = Image.new("RGB", (width, height), color)
        exif = Image.Exif()
        exif[0x0112] = 6  # orientation: rotated 90 degrees; the stored size is what Pillow's .size reports
        im.save(out, "JPEG", exif=exif.tobytes(), icc_profile=_icc(70_000 + seed % 5000))
    elif kind.startswith("webp"):
        mode = "RGBA" if kind == "webp_alpha" else "RGB"
        im = Image.new(mode, (min(width, 16383), min(height, 16383)), (*color, 128) if mode == "RGBA" else color)
        if kind == "webp_anim":
            frames = [im, Image.new(mode, im.size, (1, 2, 3))]
            frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:], duration=50)
        else:
            im.save(out, "WEBP", lossless=kind == "webp_lossless")
    elif kind == "gif_anim":
        frames = [Image.new("P", (width, height), c) for c in (1, 2)]
        frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=40)
    else:
        raise ValueError(kind)
    return out.getvalue()


def make_images(n: int, seed: int = 0, kinds: tuple[str, ...] = KINDS) -> list[tuple[bytes, str, tuple[int, int]]]:
    """Return ``n`` images: (bytes, kind, Pillow's ``Image.open(...).size``)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        w, h = _size(rng)
        if kind.startswith("webp"):
            w, h = min(w, 16383), min(h, 16383)
        data = encode(kind, w, h, i)
        out.append((data, kind, Image.open(io.BytesIO(data)).size))
    return out


def wav_bytes(frames: int, rate: int, channels: int = 1, width: int = 2) -> bytes:
    """Return a PCM WAV of ``frames`` frames (stdlib ``wave``)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(bytes(frames * channels * width))
    return out.getvalue()


def sf_bytes(frames: int, rate: int, fmt: str, subtype: str, channels: int = 1) -> bytes:
    """Return audio of ``frames`` frames encoded by soundfile (libsndfile) as ``fmt``/``subtype``."""
    import soundfile as sf

    x = (np.random.default_rng(frames).standard_normal((frames, channels)) * 0.1).astype(np.float32)
    out = io.BytesIO()
    sf.write(out, x, rate, format=fmt, subtype=subtype)
    return out.getvalue()
