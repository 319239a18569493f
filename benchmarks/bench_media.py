"""Media headers: images per second per format from sortpack's header readers against Pillow's
``Image.open(...).size`` in the same run, and the equality of the sizes and token counts with Pillow and
transformers' processors (1,000 generated images), of the audio lengths with libsndfile's decoded lengths.

    PYTHONPATH=$PWD python -m benchmarks.bench_media [--scale small|full] [--values N]

Each format's images (64 distinct ones, of real resolutions: 28-px multiples from 224 to 1,344 px)
are repeated to ``--values`` values of one Arrow binary column. sortpack's figure is the best of
three reads of the whole column (``images.image_sizes``, and the whole ``image_tokens:COL:qwen2_vl``
measure: Arrow buffers, headers, tokens per row) with the compiled JPEG walk and with its numpy
fallback; Pillow's is ``Image.open(BytesIO(value)).size`` over up to 5,000 of the values. One rank,
one process: the figure is per rank.
"""
from __future__ import annotations

import argparse
import io
import sys
import time

import numpy as np
import pyarrow as pa

from .media_data import encode, make_images, sf_bytes, wav_bytes
from .report import Row, Section, print_script_results, script_log

VALUES = {"small": 20_000, "full": 200_000}  # values per format
TARGET = 50_000  # images per second per rank (issue 46)
FORMATS = ("png", "jpeg", "jpeg_progressive", "jpeg_exif", "webp", "webp_lossless", "gif")
PILLOW_VALUES = 5_000


def _jpeg_exif(width: int, height: int, seed: int) -> bytes:
    """Return a JPEG with EXIF (orientation 6) and a 3 kB ICC profile before its frame header, as cameras write."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    Image.new("RGB", (width, height), (seed % 256, 9, 9)).save(out, "JPEG", quality=50, exif=exif.tobytes(),
                                                                 icc_profile=bytes(3144))
    return out.getvalue()


def _column(kind: str, values: int) -> list[bytes]:
    """Return ``values`` images of ``kind``: 64 distinct ones repeated."""
    rng = np.random.default_rng(len(kind))
    dims = rng.integers(8, 49, (64, 2)) * 28
    distinct = [(_jpeg_exif if kind == "jpeg_exif" else lambda w, h, s: encode(kind, w, h, s))(int(w), int(h), i)
                for i, (w, h) in enumerate(dims)]
    return [distinct[i % 64] for i in range(values)]


def _best(fn, repeats: int = 3) -> float:
    """Return the fastest of ``repeats`` calls of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _pillow_rate(blobs: list[bytes]) -> float:
    """Return Pillow's images per second: ``Image.open(BytesIO(value)).size`` of each value."""
    from PIL import Image

    sample = blobs[:PILLOW_VALUES]

    def run():
        for b in sample:
            Image.open(io.BytesIO(b)).size  # noqa: B018 - the size is what is timed

    return len(sample) / _best(run)


def _rates(blobs: list[bytes]) -> tuple[float, float, float]:
    """Return sortpack's images per second: the header readers (C walk), the whole SPEC measure, the numpy walk."""
    from sortpack.inputs.media.images import OK, image_sizes
    from sortpack.inputs.specs import evaluate, parse_spec
    from sortpack.kernels import _loader

    arr = pa.array(blobs, pa.binary())
    offsets = np.frombuffer(arr.buffers()[1], np.int32).astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    assert (image_sizes(data, starts, ends).status == OK).all()
    table = pa.table({"img": arr})
    spec = parse_spec("image_tokens:img:qwen2_vl", None, "--size")
    headers = len(blobs) / _best(lambda: image_sizes(data, starts, ends))
    measure = len(blobs) / _best(lambda: evaluate(spec, table, "bench"))
    saved = _loader._clib, _loader._warned
    _loader._clib, _loader._warned = None, True
    try:
        fallback = len(blobs) / _best(lambda: image_sizes(data, starts, ends))
    finally:
        _loader._clib, _loader._warned = saved
    return headers, measure, fallback


def _speed(values: int, log) -> tuple[Section, list[Row]]:
    """Return the per-format table and the goal row."""
    section = Section(f"image headers, {values:,} values per format (one rank)",
                      ["format", "headers/s", "image_tokens measure/s", "numpy fallback/s", "Pillow .size/s",
                       "headers vs Pillow"])
    worst = float("inf")
    for kind in FORMATS:
        log(f"{kind}: {values:,} values")
        blobs = _column(kind, values)
        headers, measure, fallback = _rates(blobs)
        pillow = _pillow_rate(blobs)
        worst = min(worst, measure, fallback)
        section.rows.append([kind, f"{headers:,.0f}", f"{measure:,.0f}", f"{fallback:,.0f}", f"{pillow:,.0f}",
                             f"{headers / pillow:.0f}×"])
    row = Row("media", "image_tokens measure, slowest format and backend", 1, f"{worst:,.0f} images/s",
              target=f"≥ {TARGET:,}/s", met=worst >= TARGET)
    return section, [row]


def _paths(log) -> tuple[Section, list[Row]]:
    """Return the rate of ``image_tokens`` over a column of local paths (files in the page cache) against Pillow's."""
    import tempfile

    from PIL import Image

    from sortpack.inputs.specs import evaluate, parse_spec

    log("2,000 image files by path")
    blobs = [b for kind in ("png", "jpeg", "jpeg_exif", "webp") for b in _column(kind, 500)]
    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for i, b in enumerate(blobs):
            names.append(f"{i}.img")
            with open(f"{tmp}/{names[-1]}", "wb") as fh:
                fh.write(b)
        table = pa.table({"path": names})
        spec = parse_spec("image_tokens:path:qwen2_vl", None, "--size")
        ours = len(names) / _best(lambda: evaluate(spec, table, f"{tmp}/data.parquet"))

        def pillow():
            for n in names:
                with Image.open(f"{tmp}/{n}") as im:
                    im.size  # noqa: B018 - the size is what is timed

        theirs = len(names) / _best(pillow)
    section = Section("image files by path (local disk, page cache; 16 reader threads)",
                      ["values", "image_tokens measure/s", "Pillow open(path).size/s", "ratio"])
    section.rows.append([f"{len(names):,}", f"{ours:,.0f}", f"{theirs:,.0f}", f"{ours / theirs:.1f}×"])
    return section, []


def _equality(log) -> tuple[Section, list[Row]]:
    """Return the equality of 1,000 generated images' sizes and tokens with Pillow and the processors."""
    from sortpack.inputs.media.images import image_sizes
    from sortpack.inputs.media.vision import LlavaNext, Qwen2VL

    log("1,000 generated images (every format and mode, 1 px to 2,200 px, up to 1:150)")
    made = make_images(1000, seed=46)
    lengths = np.array([len(b) for b, _, _ in made], np.int64)
    ends = np.cumsum(lengths)
    got = image_sizes(np.frombuffer(b"".join(b for b, _, _ in made), np.uint8), ends - lengths, ends)
    sizes = [s for _, _, s in made]
    same_size = sum(s == (int(w), int(h)) for s, w, h in zip(sizes, got.width, got.height))
    section = Section("equality with Pillow and transformers' processors (1,000 generated images)",
                      ["what", "equal", "of"])
    section.rows.append(["width and height = Pillow's Image.open(...).size", str(same_size), "1000"])
    rows = [Row("media", "image sizes equal Pillow's", None, f"{same_size}/1000", target="1000/1000",
                met=same_size == 1000)]
    try:
        from transformers import LlavaNextImageProcessor, Qwen2VLImageProcessor
    except ImportError:
        return section, rows
    w, h = got.width, got.height
    keep = ~Qwen2VL().refused(w, h)
    q = Qwen2VL()
    hf = Qwen2VLImageProcessor(min_pixels=q.min_pixels, max_pixels=q.max_pixels)
    want = np.array([hf.get_number_of_image_patches(int(b), int(a), {}) // 4 for a, b in zip(w[keep], h[keep])])
    equal = int((q.tokens(w[keep], h[keep]) == want).sum())
    section.rows.append(["qwen2_vl tokens = Qwen2VLImageProcessor's grid / merge² (aspect ≤ 200)", str(equal),
                         str(int(keep.sum()))])
    llava = _llava_counts(LlavaNextImageProcessor, w, h)
    equal_llava = int((LlavaNext().tokens(w, h) == llava).sum())
    section.rows.append(["llava_next tokens = LlavaNextProcessor's image tokens", str(equal_llava), "1000"])
    rows.append(Row("media", "image tokens equal the processors'", None,
                    f"{equal + equal_llava}/{int(keep.sum()) + 1000}", target="all",
                    met=equal == keep.sum() and equal_llava == 1000))
    return section, rows


def _llava_counts(image_processor_class, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Return LlavaNextProcessor's image tokens of each (w, h): llava-hf/llava-v1.6's settings, built in code."""
    from tokenizers import Tokenizer, models
    from transformers import LlavaNextProcessor, PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<image>": 0, "<unk>": 1}, unk_token="<unk>"))
    words.add_special_tokens(["<image>"])
    processor = LlavaNextProcessor(
        image_processor=image_processor_class(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336},
                                              image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336],
                                                                    [336, 1008]]),
        tokenizer=PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>"), patch_size=14,
        vision_feature_select_strategy="default", num_additional_image_tokens=1)
    sizes = [[int(b), int(a)] for a, b in zip(w, h)]
    return np.array(processor._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"])


def _audio(log) -> tuple[Section, list[Row]]:
    """Return the audio lengths against libsndfile's decoded lengths, and the headers' rate against sf.info."""
    from sortpack.inputs.media.audio import audio_length

    section = Section("audio lengths from headers against the decoded lengths", ["format", "equal", "of",
                                                                                 "headers/s", "soundfile.info/s"])
    try:
        import soundfile as sf
    except ImportError:
        return section, []
    log("audio: WAV, FLAC, Ogg Vorbis, Ogg Opus, MP3")
    rng = np.random.default_rng(3)
    all_equal = True
    kinds = (("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"), ("OGG", "OPUS"), ("MP3", "MPEG_LAYER_III"))
    for fmt, sub in kinds:
        clips = []
        for n in rng.integers(1000, 80_000, 40):
            rate = int(rng.choice([8000, 16000, 48000]))
            clips.append(wav_bytes(int(n), rate) if fmt == "WAV" else sf_bytes(int(n), rate, fmt, sub))
        equal = 0
        for raw in clips:
            samples, rate = audio_length(lambda o, k, r=raw: r[o:o + k], len(raw))
            decoded, decoded_rate = sf.read(io.BytesIO(raw))[0].shape[0], sf.info(io.BytesIO(raw)).samplerate
            equal += samples * decoded_rate == decoded * rate
        ours = len(clips) / _best(lambda c=clips: [audio_length(lambda o, k, r=r: r[o:o + k], len(r)) for r in c])
        theirs = len(clips) / _best(lambda c=clips: [sf.info(io.BytesIO(r)).frames for r in c])
        all_equal &= equal == len(clips)
        section.rows.append([f"{fmt} {sub}", str(equal), str(len(clips)), f"{ours:,.0f}", f"{theirs:,.0f}"])
    return section, [Row("media", "audio lengths equal the decoded lengths", None, "all" if all_equal else "NOT ALL",
                         target="all", met=all_equal)]


def measure(scale: str, log, values: int | None = None) -> tuple[list[Section], list[Row]]:
    """Return the benchmark's tables and goal rows."""
    speed, rows = _speed(values or VALUES[scale], log)
    paths, _ = _paths(log)
    equality, more = _equality(log)
    audio, audio_rows = _audio(log)
    return [speed, paths, equality, audio], rows + more + audio_rows


def bench(ctx) -> list[Row]:
    """The suite's ``media`` benchmark: its tables into the report, the goal rows back."""
    sections, rows = measure(ctx.scale_name, ctx.log)
    ctx.sections.extend(sections)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_media", description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(VALUES), default="small")
    ap.add_argument("--values", type=int, help="values per format (default: the scale's)")
    args = ap.parse_args(argv)
    log = script_log("bench_media", args.scale)
    sections, rows = measure(args.scale, log, args.values)
    print_script_results(sections, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
