"""The media size kinds as SPECs (sortpack.inputs.media.settings, .values, .measure through inputs.specs) and
as the CLI runs them: columns of bytes, lists of bytes, Hugging Face structs and paths; one-line errors."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.media_data import encode, sf_bytes, wav_bytes
from sortpack.errors import SortpackError
from sortpack.inputs.media.settings import AudioSettings, ImageSettings
from sortpack.inputs.media.vision import LlavaNext, Patches, Qwen2VL
from sortpack.inputs.specs import RowError, evaluate, parse_spec

from support import read_manifest, run_sortpack

pytest.importorskip("PIL")


def test_specs_name_their_column_scheme_and_settings():
    spec = parse_spec("image_tokens:images:qwen2_vl:min_pixels=3136,max_pixels=1003520", "text", "--size")
    assert (spec.kind, spec.column) == ("image_tokens", "images")
    assert spec.settings == ImageSettings("tokens", Qwen2VL(min_pixels=3136, max_pixels=1003520))
    spec = parse_spec("image_patches:img:llava_next:pinpoints=336x336+336x672,select=full,root=s3://b/x", None,
                      "--size2")
    assert spec.settings == ImageSettings("patches", LlavaNext(pinpoints=((336, 336), (336, 672)), select="full"),
                                          "s3://b/x")
    assert parse_spec("image_count:img", None, "--size").settings == ImageSettings("count")
    assert parse_spec("image_tokens:p:patches:patch_size=32,round=floor", None, "--size").settings.scheme == \
        Patches(32, "floor")
    assert parse_spec("audio_frames:clip", None, "--size").settings == AudioSettings(Fraction(100))
    spec = parse_spec("audio_frames:clip*12.5:root=/data", None, "--size")
    assert (spec.column, spec.settings) == ("clip", AudioSettings(Fraction(25, 2), "/data"))
    assert spec.columns() == ["clip"]


@pytest.mark.parametrize("text, message", [
    ("image_tokens", "name the column"),
    ("image_tokens:img", "name the processor's scheme"),
    ("image_tokens:img:qwen3", "unknown scheme 'qwen3'"),
    ("image_tokens:img:qwen2_vl:patch=14", "qwen2_vl has no setting 'patch'"),
    ("image_tokens:img:qwen2_vl:min_pixels=-3", "min_pixels must be a positive integer"),
    ("image_tokens:img:qwen2_vl:min_pixels=900,max_pixels=800", "min_pixels 900 is over max_pixels 800"),
    ("image_tokens:img:llava_next:pinpoints=336x500", "whole tiles of 336 px"),
    ("image_tokens:img:llava_next:select=cls", "select is one of default, full"),
    ("image_tokens:img:patches:patch_size", "expected KEY=VALUE"),
    ("image_count:img*3", "expected a column name after the kind"),
    ("image_count:img:scheme=x", "image_count takes only root=DIR"),
    ("audio_frames:a*0", "frames per second must be positive"),
    ("audio_frames:a*x1", r"expected a column name\[\*FPS\]"),
])
def test_a_bad_media_spec_is_one_line(text, message):
    with pytest.raises(SortpackError, match=message):
        parse_spec(text, None, "--size")


@pytest.fixture(scope="module")
def pictures():
    """Six images and their (width, height)."""
    sizes = [(640, 480), (28, 28), (1344, 224), (333, 777), (1, 1), (2000, 30)]
    kinds = ["png", "jpeg", "webp", "gif", "jpeg_progressive", "webp_lossless"]
    return [encode(k, w, h, i) for i, (k, (w, h)) in enumerate(zip(kinds, sizes))], sizes


def _want(sizes, scheme=Qwen2VL()) -> np.ndarray:
    w, h = np.array(sizes).T
    return scheme.tokens(w, h)


def test_bytes_lists_structs_and_nulls(pictures):
    blobs, sizes = pictures
    each = _want(sizes)
    table = pa.table({
        "one": pa.array(blobs + [None], pa.binary()),
        "many": pa.array([blobs[:2], [], None, [blobs[3], None, blobs[5]], blobs, [blobs[4]], [blobs[2]]],
                         pa.list_(pa.large_binary())),
        "hf": pa.array([{"bytes": b, "path": None} for b in blobs] + [None],
                       pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
    })
    tokens = parse_spec("image_tokens:one:qwen2_vl", None, "--size")
    assert evaluate(tokens, table, "t").tolist() == [*each.tolist(), 0]
    many = evaluate(parse_spec("image_tokens:many:qwen2_vl", None, "--size"), table, "t").tolist()
    assert many == [each[0] + each[1], 0, 0, each[3] + each[5], each.sum(), each[4], each[2]]
    assert evaluate(parse_spec("image_count:many", None, "--size"), table, "t").tolist() == [2, 0, 0, 2, 6, 1, 1]
    assert evaluate(parse_spec("image_tokens:hf:qwen2_vl", None, "--size"), table, "t").tolist() == [*each, 0]
    # a sliced, chunked column: each chunk's offsets and values taken where they begin
    chunked = pa.table({"one": pa.chunked_array([table["one"].chunk(0).slice(1, 3), table["one"].chunk(0).slice(4)])})
    assert evaluate(tokens, chunked, "t").tolist() == [*each[1:4], *each[4:], 0]
    lists = pa.table({"many": pa.chunked_array([table["many"].chunk(0).slice(3, 2), table["many"].chunk(0).slice(6)])})
    assert evaluate(parse_spec("image_tokens:many:qwen2_vl", None, "--size"), lists, "t").tolist() == \
        [many[3], many[4], many[6]]
    # Hugging Face's rows as from_pylist types them: a list of structs whose path is all null (a null type)
    pylist = pa.Table.from_pylist([{"im": [{"bytes": blobs[0], "path": None}]}, {"im": []}])
    assert evaluate(parse_spec("image_tokens:im:qwen2_vl", None, "--size"), pylist, "t").tolist() == [each[0], 0]
    with pytest.raises(SortpackError, match=r"t: column 'x' is int64; image_tokens needs a binary, path"):
        evaluate(parse_spec("image_tokens:x:qwen2_vl", None, "--size"), pa.table({"x": [1]}), "t")


def test_paths_are_under_the_input_file_s_directory_or_root(tmp_path, pictures):
    blobs, sizes = pictures
    (tmp_path / "pics").mkdir()
    for i, b in enumerate(blobs):
        (tmp_path / "pics" / f"{i}.img").write_bytes(b)
    table = pa.table({"p": [f"pics/{i}.img" for i in range(6)], "abs": [str(tmp_path / "pics" / "0.img")] * 6,
                      "list": [[f"{i}.img", f"{(i + 1) % 6}.img"] for i in range(6)]})
    source = str(tmp_path / "data.parquet")
    each = _want(sizes).tolist()
    assert evaluate(parse_spec("image_tokens:p:qwen2_vl", None, "--size"), table, source).tolist() == each
    assert evaluate(parse_spec("image_tokens:abs:qwen2_vl", None, "--size"), table, "elsewhere").tolist() == \
        [each[0]] * 6
    spec = parse_spec(f"image_tokens:list:qwen2_vl:root={tmp_path / 'pics'}", None, "--size")
    assert evaluate(spec, table, "anywhere").tolist() == [each[i] + each[(i + 1) % 6] for i in range(6)]


def test_a_jpeg_whose_frame_header_is_far_in_is_read_again(tmp_path):
    # a 70 kB ICC profile before the frame header: past the first read of a file
    (tmp_path / "big.jpg").write_bytes(encode("jpeg_exif_icc", 500, 300, 1))
    table = pa.table({"p": ["big.jpg"]})
    got = evaluate(parse_spec("image_patches:p:patches:patch_size=10", None, "--size"), table, str(tmp_path / "x"))
    assert got.tolist() == [50 * 30]


def test_a_corrupt_header_is_a_row_error_naming_its_place(tmp_path, pictures):
    blobs, _ = pictures
    table = pa.table({"many": [[blobs[0]], [blobs[1], blobs[2][:20]]], "p": ["0.img", "gone.img"]})
    with pytest.raises(RowError) as err:
        evaluate(parse_spec("image_tokens:many:qwen2_vl", None, "--size"), table, "f.parquet")
    assert str(err.value.at(100)) == ("f.parquet: row 101: column 'many': value 1 of the row: truncated WebP header "
                                      "(20 bytes; its size is within the first 30)")
    (tmp_path / "0.img").write_bytes(blobs[0])
    with pytest.raises(RowError, match=r"row 1 of the rows read: column 'p': file .*gone.img: cannot read it"):
        evaluate(parse_spec("image_patches:p:patches", None, "--size"), table, str(tmp_path / "f.parquet"))
    thin = pa.table({"b": [encode("png", 201, 1)]})
    with pytest.raises(RowError, match="an aspect ratio over 200 .201x1., which the processor refuses"):
        evaluate(parse_spec("image_tokens:b:qwen2_vl", None, "--size"), thin, "f")
    # counting images reads no header: only sizes need one
    assert evaluate(parse_spec("image_count:many", None, "--size"), table, "f").tolist() == [1, 2]


def test_audio_frames_of_bytes_and_paths(tmp_path):
    clips = [wav_bytes(16000, 16000), wav_bytes(8001, 8000, 2), wav_bytes(0, 16000)]
    (tmp_path / "a.wav").write_bytes(clips[1])
    table = pa.table({"audio": clips, "path": ["a.wav"] * 3,
                      "hf": pa.array([{"bytes": None, "path": "a.wav"}, {"bytes": clips[0], "path": "x"}, None])})
    spec = parse_spec("audio_frames:audio", None, "--size")
    assert evaluate(spec, table, "t").tolist() == [100, 101, 0]  # 10 ms frames, a partial one counted
    assert evaluate(parse_spec("audio_frames:audio*50", None, "--size"), table, "t").tolist() == [50, 51, 0]
    src = str(tmp_path / "t.parquet")
    assert evaluate(parse_spec("audio_frames:path*1", None, "--size"), table, src).tolist() == [2, 2, 2]
    assert evaluate(parse_spec("audio_frames:hf*1", None, "--size"), table, src).tolist() == [2, 1, 0]
    with pytest.raises(RowError, match="row 0 of the rows read: column 'audio': truncated WAV"):
        evaluate(spec, pa.table({"audio": [clips[0][:-2]]}), "t")


@pytest.mark.slow
def test_compressed_audio_in_a_column_counts_its_decoded_frames():
    pytest.importorskip("soundfile")
    clips = [sf_bytes(16000, 16000, "FLAC", "PCM_16"), sf_bytes(24001, 48000, "OGG", "OPUS"),
             sf_bytes(8000, 16000, "MP3", "MPEG_LAYER_III"), sf_bytes(4410, 44100, "OGG", "VORBIS")]
    got = evaluate(parse_spec("audio_frames:a", None, "--size"), pa.table({"a": [clips, clips[:1]]}), "t")
    assert got.tolist() == [100 + 51 + 50 + 10, 100]


def test_images_from_an_object_store(tmp_path, s3_env, pictures):
    blobs, sizes = pictures
    client = s3_env.client()
    client.create_bucket(Bucket="pics")
    for i, b in enumerate(blobs):
        client.put_object(Bucket="pics", Key=f"set/{i}.img", Body=b)
    table = pa.table({"p": [f"{i}.img" for i in range(6)], "url": [f"s3://pics/set/{i}.img" for i in range(6)]})
    assert evaluate(parse_spec("image_tokens:url:qwen2_vl", None, "--size"), table, "t").tolist() == \
        _want(sizes).tolist()
    assert evaluate(parse_spec("image_tokens:p:qwen2_vl", None, "--size"), table, "s3://pics/set/data.parquet"
                    ).tolist() == _want(sizes).tolist()


@pytest.mark.slow
def test_the_cli_plans_by_image_tokens_and_names_a_corrupt_row(tmp_path, pictures):
    blobs, sizes = pictures
    rows = [{"text": "a" * (i + 1), "images": [blobs[j] for j in range(i % 4)]} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet", row_group_size=16)
    run_sortpack(["run", tmp_path / "in.parquet", "-o", tmp_path / "plan", "--column", "text", "--size",
                  "image_tokens:images:qwen2_vl:max_pixels=1003520", "--size2", "image_count:images",
                  "--max-tokens", "20000", "--budget", "tokens", "--keep-empty"])
    manifest = read_manifest(tmp_path / "plan")
    each = _want(sizes, Qwen2VL(max_pixels=1003520))
    assert manifest["stats"]["tokens"] == sum(int(each[:i % 4].sum()) for i in range(40))
    assert manifest["stats"]["size2"] == sum(i % 4 for i in range(40))
    rows[39]["images"][2] = blobs[2][:25]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet", row_group_size=16)
    proc = run_sortpack(["run", tmp_path / "bad.parquet", "-o", tmp_path / "bad", "--size",
                         "image_tokens:images:qwen2_vl", "--max-tokens", "20000"], check=False)
    assert proc.returncode == 2 and not (tmp_path / "bad").exists()
    assert proc.stderr.strip().splitlines() == [
        f"Error: {tmp_path / 'bad.parquet'}: row 39: column 'images': value 2 of the row: truncated WebP header "
        "(25 bytes; its size is within the first 30)"]
