"""Image sizes from headers (sortpack.inputs.media.images, kernels.media) and the vision tokens of
sortpack.inputs.media.vision, against Pillow and transformers' own processors."""
from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.media_data import KINDS, encode, make_images
from sortpack.inputs.media import images as im
from sortpack.inputs.media.vision import LlavaNext, Patches, Qwen2VL
from sortpack.kernels import _loader, media

pytest.importorskip("PIL")


def _column(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (data, starts, ends) of the values ``blobs`` laid end to end, as an Arrow binary column holds them."""
    lengths = np.array([len(b) for b in blobs], np.int64)
    ends = np.cumsum(lengths)
    return np.frombuffer(b"".join(blobs), np.uint8), ends - lengths, ends


@pytest.fixture(params=["c", "numpy"])
def backend(request, monkeypatch):
    """Run a test with the compiled kernels and again with the numpy fallback."""
    if request.param == "numpy":
        monkeypatch.setattr(_loader, "_clib", None)
        monkeypatch.setattr(_loader, "_warned", True)
    elif _loader.backend() != "c":
        pytest.skip("the compiled kernels are not built")
    return request.param


def _sizes(blobs: list[bytes]) -> im.ImageSizes:
    return im.image_sizes(*_column(blobs))


@pytest.fixture(scope="module")
def thousand():
    """The 1,000 generated images of the issue: every kind of KINDS, sizes from 1 px to 2,200 px and 1:150."""
    return make_images(1000, seed=46)


def test_every_kind_reads_pillow_s_size(backend):
    made = make_images(3 * len(KINDS), seed=1)
    got = _sizes([b for b, _, _ in made])
    assert (got.status == im.OK).all(), [got.problem(i) for i in np.flatnonzero(got.status)]
    assert list(zip(got.width.tolist(), got.height.tolist())) == [size for _, _, size in made]
    assert [im.FORMATS[f] for f in got.fmt] == [k.split("_")[0].upper().replace("WEBP", "WebP") for _, k, _ in made]


@pytest.mark.slow
def test_a_thousand_images_equal_pillow_and_the_processors(thousand):
    from transformers import LlavaNextImageProcessor, Qwen2VLImageProcessor

    got = _sizes([b for b, _, _ in thousand])
    assert (got.status == im.OK).all()
    sizes = [s for _, _, s in thousand]
    assert list(zip(got.width.tolist(), got.height.tolist())) == sizes
    keep = ~Qwen2VL().refused(got.width, got.height)  # the processor refuses an aspect ratio over 200
    assert keep.sum() > 900
    for scheme in (Qwen2VL(), Qwen2VL(min_pixels=256 * 28 * 28, max_pixels=1280 * 28 * 28),
                   Qwen2VL(patch_size=16, min_pixels=65536, max_pixels=16777216)):
        hf = Qwen2VLImageProcessor(patch_size=scheme.patch_size, merge_size=scheme.merge_size,
                                   min_pixels=scheme.min_pixels, max_pixels=scheme.max_pixels)
        want = [hf.get_number_of_image_patches(h, w, {}) for (w, h), k in zip(sizes, keep) if k]
        assert scheme.patches(got.width[keep], got.height[keep]).tolist() == want
        assert scheme.tokens(got.width[keep], got.height[keep]).tolist() == [n // 4 for n in want]
    processor = _llava_processor(LlavaNextImageProcessor)
    want = processor._get_num_multimodal_tokens(image_sizes=[[h, w] for w, h in sizes])["num_image_tokens"]
    assert LlavaNext().tokens(got.width, got.height).tolist() == want


def _llava_processor(image_processor_class, pinpoints=None):
    """Return transformers' LlavaNextProcessor of llava-hf/llava-v1.6's settings, from code (nothing downloaded)."""
    from tokenizers import Tokenizer, models
    from transformers import LlavaNextProcessor, PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<image>": 0, "<unk>": 1}, unk_token="<unk>"))
    words.add_special_tokens(["<image>"])  # so that "<image><image>..." is one token each
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")
    images = image_processor_class(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336},
                                   image_grid_pinpoints=[list(p) for p in (pinpoints or LlavaNext().pinpoints)])
    return LlavaNextProcessor(image_processor=images, tokenizer=tokenizer, patch_size=14,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1)


@pytest.mark.slow
def test_the_processors_on_the_decoded_pixels_give_the_same_counts():
    # the processors' own outputs on real pixels: Qwen2-VL's image_grid_thw, LLaVA-NeXT's <image> tokens
    from PIL import Image
    from transformers import LlavaNextImageProcessor, Qwen2VLImageProcessor

    made = [m for m in make_images(12, seed=5, kinds=("jpeg", "png", "webp", "gif")) if max(m[2]) / min(m[2]) < 200]
    got = _sizes([b for b, _, _ in made])
    pics = [Image.open(io.BytesIO(b)).convert("RGB") for b, _, _ in made]
    grid = np.asarray(Qwen2VLImageProcessor(min_pixels=3136, max_pixels=1003520)(pics)["image_grid_thw"])
    assert Qwen2VL(max_pixels=1003520).patches(got.width, got.height).tolist() == grid.prod(axis=1).tolist()
    processor = _llava_processor(LlavaNextImageProcessor)
    for pic, w, h in zip(pics[:4], got.width, got.height):
        ids = processor(text="<image>", images=pic)["input_ids"][0]
        assert LlavaNext().tokens(np.array([w]), np.array([h])).tolist() == [list(ids).count(0)]


def _smart_resize():
    """Return transformers' own smart_resize (its PIL module: the torchvision one needs torchvision)."""
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    return smart_resize


@settings(deadline=None, max_examples=100)
@given(st.integers(1, 20000), st.integers(1, 20000), st.sampled_from([14, 16]), st.sampled_from([1, 2]),
       st.integers(1, 5000), st.integers(1, 20000))
def test_smart_resize_is_transformers_own(w, h, patch, merge, lo, span):
    smart_resize = _smart_resize()
    q = Qwen2VL(patch_size=patch, merge_size=merge, min_pixels=lo * 28, max_pixels=(lo + span) * 784)
    if q.refused(np.array([w]), np.array([h]))[0]:
        with pytest.raises(ValueError):
            smart_resize(h, w, patch * merge, q.min_pixels, q.max_pixels)
        return
    rh, rw = smart_resize(h, w, patch * merge, q.min_pixels, q.max_pixels)
    gh, gw = q.grid(np.array([w]), np.array([h]))
    assert (int(gh[0]), int(gw[0])) == (rh // patch, rw // patch)


@settings(deadline=None, max_examples=100)
@given(st.integers(1, 6000), st.integers(1, 6000), st.sampled_from([None, ((336, 336), (336, 672), (672, 336)),
                                                                    tuple((336 * a, 336 * b) for a in range(1, 4)
                                                                          for b in range(1, 4))]))
def test_any_res_is_transformers_own(w, h, pinpoints):
    pytest.importorskip("transformers")
    from transformers import LlavaNextImageProcessor

    processor = _llava_processor(LlavaNextImageProcessor, pinpoints)
    scheme = LlavaNext(pinpoints=pinpoints) if pinpoints else LlavaNext()
    want = processor._get_num_multimodal_tokens(image_sizes=[[h, w]])["num_image_tokens"]
    assert scheme.tokens(np.array([w]), np.array([h])).tolist() == want
    full = dataclasses.replace(scheme, select="full", cls=0)  # no CLS token to drop: the same count
    assert (full.tokens(np.array([w]), np.array([h])) == scheme.tokens(np.array([w]), np.array([h]))).all()


def test_plain_patches_round_up_or_down():
    w, h = np.array([32, 33, 1]), np.array([16, 17, 1])
    assert Patches(patch_size=16).tokens(w, h).tolist() == [2, 6, 1]
    assert Patches(patch_size=16, round="floor").tokens(w, h).tolist() == [2, 2, 0]


@pytest.mark.parametrize("kind", ["png", "jpeg", "jpeg_progressive", "jpeg_exif_icc", "webp", "webp_lossless",
                                  "webp_alpha", "gif"])
def test_every_cut_of_a_header_is_refused_or_right(backend, kind):
    # the oracle: a prefix of an image either gives the image's size or says it is truncated; never a wrong size
    data = encode(kind, 300, 200, 3)
    cuts = sorted(set(range(0, min(len(data), 200))) | set(range(0, len(data), 997)) | {len(data)})
    got = _sizes([data[:c] for c in cuts])
    ok = got.status == im.OK
    assert ok[-1] and (got.width[ok] == 300).all() and (got.height[ok] == 200).all()
    assert set(got.status[~ok].tolist()) <= {im.TRUNCATED, im.UNKNOWN}
    short = np.flatnonzero(got.status == im.TRUNCATED)
    assert all(got.need[i] > cuts[i] for i in short)
    assert "truncated" in got.problem(int(short[-1])) if short.size else True


def test_what_is_not_an_image_says_so(backend):
    zero_gif = b"GIF89a\x00\x00\x05\x00" + bytes(20)
    bad_png = b"\x89PNG\r\n\x1a\n" + bytes(4) + b"IDAT" + bytes(8)
    no_frame = b"\xff\xd8\xff\xe0\x00\x04ab\xff\xda\x00\x02"
    got = _sizes([b"", b"BM6\x00\x00", zero_gif, bad_png, no_frame, b"\xff\xd8\xff\xc0\x00\x0b\x08\x00\x00\x00\x10"])
    assert got.status.tolist() == [im.UNKNOWN, im.UNKNOWN, im.NO_SIZE, im.CORRUPT, im.CORRUPT, im.NO_SIZE]
    assert got.problem(0) == "an empty value, not an image"
    assert got.problem(1) == "not a PNG, JPEG, WebP or GIF image"
    assert got.problem(2) == "GIF header gives no size (width 0, height 5)"
    assert "IHDR" in got.problem(3) and "frame header" in got.problem(4)


@settings(deadline=None, max_examples=100)
@given(st.lists(st.binary(min_size=0, max_size=60), max_size=12), st.data())
def test_the_numpy_walk_equals_the_compiled_one_on_any_bytes(tails, data):
    if _loader.backend() != "c":
        pytest.skip("the compiled kernels are not built")
    # JPEG-like values: markers with lengths, fill bytes and frame headers at random
    blobs = [b"\xff\xd8" + data.draw(st.sampled_from([b"\xff\xe1\x00\x04ab", b"\xff\xff", b"\xff\xc2\x00\x11",
                                                      b"\xff\xd0", b""])) + t for t in tails]
    args = _column(blobs)
    compiled = media.jpeg_sizes(*args)
    fallback = media._numpy_sizes(args[0], args[1].astype(np.int64), args[2].astype(np.int64))
    for a, b in zip(compiled, fallback):
        assert a.tolist() == b.tolist()
