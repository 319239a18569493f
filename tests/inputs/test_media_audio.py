"""Audio lengths from headers (sortpack.inputs.media.audio) against the decoded lengths (wave, soundfile)."""
from __future__ import annotations

import io
import struct

import pytest

from benchmarks.media_data import sf_bytes, wav_bytes
from sortpack.inputs.media.audio import audio_length


def _length(raw: bytes) -> tuple[int, int]:
    return audio_length(lambda o, n: raw[o:o + n], len(raw))


@pytest.mark.parametrize("frames, rate, channels, width", [(0, 8000, 1, 1), (1234, 8000, 2, 2), (16001, 16000, 1, 2),
                                                           (44101, 44100, 2, 3), (999, 22050, 6, 4)])
def test_wav_gives_its_frames(frames, rate, channels, width):
    assert _length(wav_bytes(frames, rate, channels, width)) == (frames, rate)


def _decoded(raw: bytes) -> tuple[int, int]:
    import soundfile as sf

    samples, rate = sf.read(io.BytesIO(raw))
    return len(samples), rate


@pytest.mark.parametrize("fmt, subtype", [("FLAC", "PCM_16"), ("FLAC", "PCM_24"), ("OGG", "VORBIS"), ("OGG", "OPUS"),
                                          ("MP3", "MPEG_LAYER_III"), ("WAV", "FLOAT"), ("WAV", "ULAW"),
                                          ("RF64", "PCM_16")])
@pytest.mark.parametrize("frames, rate", [(1000, 16000), (16001, 48000), (144007, 44100), (30011, 22050)])
def test_compressed_audio_gives_the_decoded_length(fmt, subtype, frames, rate):
    pytest.importorskip("soundfile")
    if subtype == "OPUS" and rate not in (8000, 12000, 16000, 24000, 48000):
        pytest.skip("Opus encodes 8, 12, 16, 24 and 48 kHz")
    raw = sf_bytes(frames, rate, fmt, subtype, channels=2 if frames % 2 else 1)
    samples, got_rate = _length(raw)
    decoded, decoded_rate = _decoded(raw)
    # the same duration, exactly (Opus counts at 48 kHz whatever rate a decoder gives)
    assert samples * decoded_rate == decoded * got_rate
    assert decoded == frames


def test_an_mp3_without_a_vbr_header_is_walked_frame_by_frame():
    pytest.importorskip("soundfile")
    raw = sf_bytes(50_000, 16000, "MP3", "MPEG_LAYER_III")
    first_frame = 0
    size = _frame_bytes(raw[first_frame:first_frame + 4])
    bare = raw[size:]  # without the Xing/Info frame: what a plain CBR stream is
    samples, rate = _length(bare)
    frames = 0
    pos = 0
    while pos + 4 <= len(bare):
        pos += _frame_bytes(bare[pos:pos + 4])
        frames += 1
    assert (samples, rate) == (frames * 576, 16000)  # MPEG-2 layer III: 576 samples a frame
    with_id3 = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + bare + b"TAG" + bytes(125)
    assert _length(with_id3) == (samples, rate)


def _frame_bytes(h: bytes) -> int:
    """Return an MPEG-2 layer III frame's bytes (the test's own arithmetic, from the standard)."""
    kbps = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)[h[2] >> 4]
    rate = (22050, 24000, 16000)[(h[2] >> 2) & 3]
    return 72000 * kbps // rate + ((h[2] >> 1) & 1)


def test_truncated_and_foreign_values_are_refused():
    wav = wav_bytes(1000, 8000)
    with pytest.raises(ValueError, match="truncated WAV"):
        _length(wav[:-10])
    with pytest.raises(ValueError, match="no data chunk"):
        _length(wav[:36])
    with pytest.raises(ValueError, match="compressed WAV"):
        _length(sf_bytes(1000, 8000, "WAV", "IMA_ADPCM"))
    with pytest.raises(ValueError, match="not a WAV, FLAC, MP3"):
        _length(b"\x00" * 64)
    with pytest.raises(ValueError, match="empty value"):
        _length(b"")
    flac = b"fLaC" + bytes([0x80, 0, 0, 34]) + bytes(10) + (44100 << 44 | 0).to_bytes(8, "big") + bytes(16)
    with pytest.raises(ValueError, match="without a total sample count"):
        _length(flac)
    with pytest.raises(ValueError, match="truncated FLAC"):
        _length(flac[:20])
    ogg = b"OggS" + bytes(2) + struct.pack("<qI", -1, 7) + bytes(8) + b"\x01\x1e" + b"\x01vorbis" + bytes(4) + \
        b"\x01" + struct.pack("<I", 16000) + bytes(14)
    with pytest.raises(ValueError, match="no final page"):
        _length(ogg)
