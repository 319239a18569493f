"""Audio lengths from their headers, without decoding a sample: WAV (and RF64), FLAC, MP3, Ogg Vorbis and Ogg Opus.

Each reader returns the file's (samples, rate): the length a decoder returns, exactly where the
header says it. WAV: the data chunk's bytes over the block size (PCM, float, A-law and mu-law;
a compressed WAV, such as ADPCM, is refused: a decoder returns whole blocks, which its header
does not say). FLAC: STREAMINFO's total samples. Ogg: the last page's granule
position of the first stream (less Opus's pre-skip; Opus counts at 48 kHz). MP3: the Xing/Info
(or VBRI) frame count times the samples per frame, less the LAME tag's encoder delay and
padding (what a gapless decoder such as mpg123 removes); an MP3 without such a header is walked
frame by frame to its end (exact, and the whole file is read). Anything else, or a header that
ends early or contradicts itself, is a ``ValueError`` whose text the caller names the row with.

A value is read through ``at(offset, n) -> bytes`` and its byte size, so an in-memory value
and a file (only the bytes asked for are read) go through the same code.
"""
from __future__ import annotations

import struct
from collections.abc import Callable

Reader = Callable[[int, int], bytes]  # (offset, n) -> at most n bytes at offset

_PCM_TAGS = {1, 3, 6, 7, 0xFFFE}  # PCM, IEEE float, A-law, mu-law, extensible: frames = bytes / block
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MP3_KBPS = {  # (MPEG-1?, layer) -> kbit/s by index 1..14
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_OGG_PAGE_MAX = 27 + 255 + 255 * 255  # the largest Ogg page: the last one starts within this of the end


def _need(buf: bytes, n: int, what: str) -> bytes:
    """Return ``buf`` when it holds ``n`` bytes, else raise the truncation."""
    if len(buf) < n:
        raise ValueError(f"truncated {what} header")
    return buf


def audio_length(at: Reader, size: int) -> tuple[int, int]:
    """Return (samples, sample rate) of the audio value of ``size`` bytes read through ``at``."""
    head = at(0, 16)
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return _wav(at, size)
    if head[:4] == b"OggS":
        return _ogg(at, size)
    start = _id3_end(head)
    head = at(start, 4)
    if head == b"fLaC":
        return _flac(at, start)
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return _mp3(at, size, start)
    if not size:
        raise ValueError("an empty value, not audio")
    raise ValueError("not a WAV, FLAC, MP3, Ogg Vorbis or Ogg Opus file")


def _id3_end(head: bytes) -> int:
    """Return where the audio begins after an ID3v2 tag (0 without one)."""
    if head[:3] != b"ID3" or len(head) < 10:
        return 0
    size = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | (head[9] & 0x7F)
    return 10 + size + (10 if head[5] & 0x10 else 0)  # the footer flag adds 10 bytes


def _wav(at: Reader, size: int) -> tuple[int, int]:
    """Return a WAV's (samples, rate) from its fmt and data chunks (RF64: the ds64 sizes)."""
    pos, fmt, data, big = 12, None, None, None
    while data is None:
        chunk = at(pos, 8)
        if len(chunk) < 8:
            break
        cid, n = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if cid == b"ds64":
            big = struct.unpack("<QQQ", _need(at(pos + 8, 24), 24, "RF64 ds64"))
        elif cid == b"fmt ":
            fmt = struct.unpack("<HHIIH", _need(at(pos + 8, 14), 14, "WAV fmt"))
        elif cid == b"data":
            data = big[1] if big is not None and n == 0xFFFFFFFF else n
            if pos + 8 + data > size:
                raise ValueError(f"truncated WAV: its data chunk has {data} bytes, the file ends "
                                 f"{size - pos - 8} bytes after its start")
        pos += 8 + n + (n & 1)
    if fmt is None or data is None:
        raise ValueError(f"corrupt WAV header (no {'fmt' if fmt is None else 'data'} chunk)")
    tag, _, rate, _, block = fmt
    if rate == 0:
        raise ValueError("corrupt WAV header (a sample rate of 0)")
    if tag not in _PCM_TAGS:
        # ADPCM and the like: decoders return whole blocks, which the fact chunk (when written right) does not say
        raise ValueError(f"compressed WAV (format tag {tag:#x}): its decoded length is not in its header")
    if block == 0:
        raise ValueError("corrupt WAV header (a block size of 0)")
    return data // block, rate


def _flac(at: Reader, start: int) -> tuple[int, int]:
    """Return a FLAC's (samples, rate) from its STREAMINFO block (the first metadata block)."""
    block = _need(at(start + 4, 4 + 34), 38, "FLAC STREAMINFO")
    if block[0] & 0x7F != 0:
        raise ValueError("corrupt FLAC header (STREAMINFO is not the first metadata block)")
    bits = int.from_bytes(block[4 + 10:4 + 18], "big")
    rate, samples = bits >> 44, bits & ((1 << 36) - 1)
    if rate == 0:
        raise ValueError("corrupt FLAC header (a sample rate of 0)")
    if samples == 0:
        raise ValueError("FLAC header without a total sample count (a streamed encode): its length is "
                         "not in its header")
    return samples, rate


def _ogg(at: Reader, size: int) -> tuple[int, int]:
    """Return an Ogg Vorbis or Opus stream's (samples, rate): the last page's granule position."""
    page = _need(at(0, 27 + 255), 28, "Ogg page")
    serial, nsegs = struct.unpack("<I", page[14:18])[0], page[26]
    packet = at(27 + nsegs, 20)
    if packet[:7] == b"\x01vorbis":
        rate, skip = struct.unpack("<I", _need(packet, 16, "Vorbis")[12:16])[0], 0
    elif packet[:8] == b"OpusHead":
        rate, skip = 48000, struct.unpack("<H", _need(packet, 12, "Opus")[10:12])[0]
    else:
        raise ValueError("Ogg stream of neither Vorbis nor Opus")
    lo = max(0, size - _OGG_PAGE_MAX)
    tail = at(lo, size - lo)
    end = len(tail)
    while (i := tail.rfind(b"OggS", 0, end)) >= 0:
        granule, page_serial = struct.unpack("<qI", tail[i + 6:i + 18]) if i + 18 <= len(tail) else (-1, -1)
        if page_serial == serial and granule >= 0:
            if granule < skip or rate == 0:
                raise ValueError("corrupt Ogg header (a last granule before the pre-skip)")
            return granule - skip, rate
        end = i
    raise ValueError("truncated Ogg stream (no final page with a granule position)")


def _mp3_frame(h: bytes) -> tuple[int, int, int, bool, bool]:
    """Return (frame bytes, samples per frame, rate, MPEG-1, mono) of the MP3 frame header ``h``."""
    version, layer = (h[1] >> 3) & 3, 4 - ((h[1] >> 1) & 3)
    index, rate_index, pad = h[2] >> 4, (h[2] >> 2) & 3, (h[2] >> 1) & 1
    if h[0] != 0xFF or h[1] & 0xE0 != 0xE0 or version == 1 or layer == 4 or rate_index == 3 or index in (0, 15):
        raise ValueError("corrupt MP3 frame header (or a free-format bitrate)")
    mpeg1 = version == 3
    rate = _MP3_RATES[version][rate_index]
    kbps = _MP3_KBPS[(mpeg1, layer if mpeg1 or layer == 1 else 2)][index - 1]
    if layer == 1:
        return (12000 * kbps // rate + pad) * 4, 384, rate, mpeg1, h[3] >> 6 == 3
    per = 1152 if mpeg1 or layer == 2 else 576
    return per // 8 * 1000 * kbps // rate + pad, per, rate, mpeg1, h[3] >> 6 == 3


def _mp3(at: Reader, size: int, start: int) -> tuple[int, int]:
    """Return an MP3's (samples, rate): from its Xing/Info or VBRI frame, else by walking its frames."""
    first = _need(at(start, 4 + 36 + 26), 4, "MP3 frame")
    nbytes, per, rate, mpeg1, mono = _mp3_frame(first)
    xing = 4 + (17 if mono else 32) if mpeg1 else 4 + (9 if mono else 17)
    tag = at(start + xing, 120 + 24)
    if tag[:4] in (b"Xing", b"Info") and len(tag) >= 12 and tag[7] & 1:
        frames = struct.unpack(">I", tag[8:12])[0]
        return max(0, frames * per - _lame_gap(tag)), rate
    if first[36:40] == b"VBRI" and len(first) >= 4 + 36 + 18:
        frames = struct.unpack(">I", first[36 + 14:36 + 18])[0]
        return frames * per, rate
    frames, pos = 0, start
    while pos + 4 <= size:
        h = at(pos, 4)
        if h[:3] == b"TAG" or h[:4] == b"APET":  # ID3v1 or APE tag: the audio ended
            break
        nbytes, _, _, _, _ = _mp3_frame(h)
        pos += nbytes
        frames += 1
    if pos > size:
        raise ValueError(f"truncated MP3 (its last frame ends {pos - size} bytes past the end)")
    return frames * per, rate


def _lame_gap(tag: bytes) -> int:
    """Return the LAME tag's encoder delay plus padding (0 without a LAME tag)."""
    flags = tag[7]
    at = 8 + 4 * bool(flags & 1) + 4 * bool(flags & 2) + 100 * bool(flags & 4) + 4 * bool(flags & 8)
    if len(tag) < at + 24 or tag[at:at + 4] not in (b"LAME", b"Lavf", b"Lavc"):
        return 0
    gap = tag[at + 21:at + 24]
    return (gap[0] << 4 | gap[1] >> 4) + ((gap[1] & 0x0F) << 8 | gap[2])
