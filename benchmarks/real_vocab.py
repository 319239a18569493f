"""Real vocabularies and real mixed-language text for the tokenizer path (``bench_tokens``, ``tests/inputs``).

Vocabularies: the tiktoken rank files that ship in registry packages (``openai-whisper``'s
``gpt2.tiktoken`` and ``multilingual.tiktoken``; ``pip install --no-deps openai-whisper``, as its
dependencies would pull torch), located without importing the package, and written as the
``tokenizer.json`` a converter from tiktoken's files writes (every split of a token into two
tokens is a merge, grouped by the token's rank): GPT-2's ByteLevel file, and Split-regex files with
Llama 3's, Qwen 2's or GPT-2's pattern and ``ignore_merges``, as Meta's Llama 3 file has.

SentencePiece BPE vocabularies: Mistral's own ``.model`` files that ship in ``mistral-common``'s
wheel (Mistral 7B v0.1's 32,000 pieces and v0.3's 32,768), taken from the folder ``MISTRAL_COMMON_DATA``
names (CI unpacks them there from the wheel ``pip download`` fetches: installing the package without its
dependencies breaks transformers, which imports it when it finds it), else from an installed
``mistral-common``, read
without sentencepiece (their pieces are a protobuf's first repeated field) and written as the
``tokenizer.json`` the Hugging Face converter writes for them: byte fallback, the merges of every
two-piece split of each piece ordered by the piece it makes, the control pieces as added tokens, a
BOS template, and either shape of the space replacement (a Prepend + Replace normalizer, as Mistral's
published files have, or a Metaspace pre-tokenizer, as newer conversions write).

Text: what this machine holds in many languages, read in a fixed order: the translations of the
gettext catalogs (``/usr/share/locale`` and beside installed packages), the Python standard
library's test data and sources (its non-ASCII files among them, CJK encodings' samples too).
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import struct
import sysconfig
from pathlib import Path

from sortpack.inputs.bpe_conversion import GPT2_PATTERN, VERIFIED_PATTERNS, byte_chars

ASSETS = ("gpt2", "multilingual")
# name -> (the rank file, the pattern's style, ignore_merges)
VARIANTS = {
    "gpt2": ("gpt2", "gpt2", False),
    "multilingual-llama3": ("multilingual", "llama3", True),
    "multilingual-qwen2": ("multilingual", "qwen2", True),
    "multilingual-gpt2": ("multilingual", "gpt2", True),
}
SPECIALS = ("<|endoftext|>", "<|begin_of_text|>", "<|im_start|>")
# name -> (mistral-common's model file, the shape of its space replacement)
SP_VARIANTS = {
    "mistral-v1": ("tokenizer.model.v1", "normalizer"),
    "mistral-v3": ("mistral_instruct_tokenizer_240323.model.v3", "normalizer"),
    "mistral-v3-metaspace": ("mistral_instruct_tokenizer_240323.model.v3", "metaspace"),
    "mistral-v3-metaspace-always": ("mistral_instruct_tokenizer_240323.model.v3", "metaspace-always"),
}
_NORMAL, _UNKNOWN, _CONTROL, _USER, _BYTE = 1, 2, 3, 4, 6  # SentencePiece's piece types


def whisper_assets() -> dict[str, Path] | None:
    """Return openai-whisper's tiktoken rank files by name (None: the package is not installed; not imported)."""
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "assets"
    found = {name: folder / f"{name}.tiktoken" for name in ASSETS}
    return found if all(p.is_file() for p in found.values()) else None


def load_ranks(path: Path) -> dict[bytes, int]:
    """Return a tiktoken rank file's ranks (each line: the token's bytes in base64, its rank)."""
    out = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            out[base64.b64decode(token)] = int(rank)
    return out


def _merges(vocab: dict[str, int]) -> list[list[str]]:
    """Return every split of every token into two tokens, grouped by the token's rank (as tiktoken converters do)."""
    merges = []
    for token in sorted(vocab, key=vocab.__getitem__):
        splits = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
        merges.extend([a, b] for a, b in sorted(splits, key=lambda s: (vocab[s[0]], vocab[s[1]])))
    return merges


def tokenizer_json(ranks: dict[bytes, int], style: str, ignore_merges: bool) -> dict:
    """Return a tokenizer.json of ``ranks`` with ``style``'s pattern, the added tokens after the ranks, and the
    post-processor of its family (GPT-2: ByteLevel; Llama 3: a BOS template; Qwen 2: an EOS template)."""
    spell = {b: c for c, b in byte_chars().items()}
    vocab = {"".join(spell[b] for b in token): rank for token, rank in ranks.items()}
    top = max(ranks.values()) + 1
    added = [{"id": top + k, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, c in enumerate(SPECIALS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": style == "gpt2"}
    if style == "gpt2" and not ignore_merges:
        pre: dict = byte_level
    else:
        pattern = GPT2_PATTERN if style == "gpt2" else VERIFIED_PATTERNS[style]
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {**byte_level, "use_regex": False}]}
    special = SPECIALS[1] if style == "llama3" else SPECIALS[0]
    where = ([{"SpecialToken": {"id": special, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
             if style == "llama3" else
             [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": special, "type_id": 0}}])
    post = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True} \
        if style == "gpt2" else {"type": "TemplateProcessing", "single": where, "pair": where + [
            {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {
                special: {"id": special, "ids": [top + SPECIALS.index(special)], "tokens": [special]}}}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre, "post_processor": post, "decoder": {**byte_level, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": _merges(vocab)}}


def write_variant(name: str, folder: Path) -> Path | None:
    """Return the tokenizer.json of ``VARIANTS[name]`` written in ``folder`` (None: openai-whisper not installed)."""
    assets = whisper_assets()
    if assets is None:
        return None
    path = folder / f"{name}.json"
    if not path.is_file():
        asset, style, ignore = VARIANTS[name]
        path.write_text(json.dumps(tokenizer_json(load_ranks(assets[asset]), style, ignore)), encoding="utf-8")
    return path


def mistral_models() -> Path | None:
    """Return the folder of mistral-common's tokenizer files: ``MISTRAL_COMMON_DATA``, else the installed package's
    (not imported); None where neither holds them."""
    given = os.environ.get("MISTRAL_COMMON_DATA")
    if given:
        folder = Path(given)
    else:
        spec = importlib.util.find_spec("mistral_common")
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    return folder if all((folder / m).is_file() for m, _ in SP_VARIANTS.values()) else None


def unpack_mistral_models(wheel: Path, folder: Path) -> None:
    """Write the SentencePiece model files of a mistral-common wheel into ``folder`` (nothing else of it)."""
    import zipfile

    names = {m for m, _ in SP_VARIANTS.values()}
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.filename.startswith("mistral_common/data/") and Path(info.filename).name in names:
                (folder / Path(info.filename).name).write_bytes(z.read(info))


def _varint(raw: bytes, at: int) -> tuple[int, int]:
    """Return (the protobuf varint at ``at``, the position after it)."""
    value = shift = 0
    while True:
        b = raw[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, at


def _fields(raw: bytes):
    """Yield (field number, wire type, value) of a protobuf message: bytes for wire type 2, ints else."""
    at = 0
    while at < len(raw):
        key, at = _varint(raw, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(raw, at)
        elif wire == 1:
            value, at = int.from_bytes(raw[at:at + 8], "little"), at + 8
        elif wire == 2:
            length, at = _varint(raw, at)
            value, at = raw[at:at + length], at + length
        elif wire == 5:
            value, at = int.from_bytes(raw[at:at + 4], "little"), at + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")
        yield number, wire, value


def sentencepiece_pieces(path: Path) -> list[tuple[str, int]]:
    """Return a SentencePiece ``.model``'s pieces in id order, each (text, type): ModelProto field 1, each a
    SentencePiece message of piece (1), score (2) and type (3, NORMAL by default)."""
    out = []
    for number, wire, value in _fields(path.read_bytes()):
        if number == 1 and wire == 2:
            piece, kind = "", _NORMAL
            for n, _, v in _fields(value):
                if n == 1:
                    piece = v.decode("utf-8")
                elif n == 3:
                    kind = v
            out.append((piece, kind))
    return out


def sentencepiece_json(pieces: list[tuple[str, int]], shape: str) -> dict:
    """Return the tokenizer.json of a SentencePiece BPE's pieces as the Hugging Face converter writes it, with the
    space replacement in ``shape`` ("normalizer", "metaspace": prepend_scheme "first", or "metaspace-always")."""
    vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
    normal = {piece for piece, kind in pieces if kind in (_NORMAL, _USER)}
    merges = sorted((vocab[t], vocab[t[:k]], vocab[t[k:]]) for t in normal for k in range(1, len(t))
                    if t[:k] in normal and t[k:] in normal)
    added = [{"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": kind != _USER}
             for i, (piece, kind) in enumerate(pieces) if kind in (_UNKNOWN, _CONTROL, _USER)]
    bos = "<s>"
    where = [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    post = {"type": "TemplateProcessing", "single": where,
            "pair": where + [{"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}}}
    space = "\u2581"
    if shape == "normalizer":
        normalizer: dict | None = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": space}, {"type": "Replace", "pattern": {"String": " "}, "content": space}]}
        pre = None
    else:
        scheme = "always" if shape == "metaspace-always" else "first"
        normalizer, pre = None, {"type": "Metaspace", "replacement": space, "prepend_scheme": scheme, "split": False}
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": space}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": pre, "post_processor": post, "decoder": decoder,
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": [[pieces[a][0], pieces[b][0]] for _, a, b in merges]}}


def write_sentencepiece(name: str, folder: Path) -> Path | None:
    """Return the tokenizer.json of ``SP_VARIANTS[name]`` written in ``folder`` (None: mistral-common not installed)."""
    models = mistral_models()
    if models is None:
        return None
    path = folder / f"{name}.json"
    if not path.is_file():
        model, shape = SP_VARIANTS[name]
        path.write_text(json.dumps(sentencepiece_json(sentencepiece_pieces(models / model), shape)),
                        encoding="utf-8")
    return path


def _mo_texts(raw: bytes) -> list[str]:
    """Return the translations of a gettext catalog (a .mo file), plural forms one per line; [] if not UTF-8."""
    if len(raw) < 20:
        return []
    order = {0x950412DE: "<", 0xDE120495: ">"}.get(struct.unpack("<I", raw[:4])[0])
    if order is None:
        return []
    n, _, trans_at = struct.unpack(order + "3I", raw[8:20])
    out = []
    for k in range(n):
        length, at = struct.unpack(order + "2I", raw[trans_at + 8 * k:trans_at + 8 * k + 8])
        try:
            out.append(raw[at:at + length].decode("utf-8").replace("\x00", "\n"))
        except UnicodeDecodeError:
            return []
    return out[1:] if out and out[0].startswith("Project-Id") else out  # the header is no text


def _catalogs() -> list[Path]:
    roots = [Path("/usr/share/locale"), Path(sysconfig.get_paths()["purelib"])]
    return sorted({p for root in roots if root.is_dir() for p in root.rglob("*.mo")})


def _stdlib_files() -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for pattern in ("*.py", "test/**/*.py", "test/**/*.txt", "test/cjkencodings/*-utf8.txt")
                  for p in lib.glob(pattern) if "site-packages" not in p.parts)


def mixed_texts(documents: int = 0, longest: int = 20_000) -> list[str]:
    """Return real documents in many languages (``documents`` of them, 0: all; each cut to ``longest`` characters):
    gettext catalogs' translations and the standard library's files, interleaved in a fixed order."""
    def catalogs():
        for path in _catalogs():
            texts = _mo_texts(path.read_bytes())
            if texts:
                yield "\n".join(texts)[:longest]

    def sources():
        for path in dict.fromkeys(_stdlib_files()):
            try:
                yield path.read_text(encoding="utf-8")[:longest]
            except (UnicodeDecodeError, OSError):
                continue

    out: list[str] = []
    a, b = catalogs(), sources()
    while not documents or len(out) < documents:
        got = [t for t in (next(a, None), next(b, None)) if t is not None]
        if not got:
            break
        out.extend(t for t in got if t)
    return out[:documents] if documents else out


if __name__ == "__main__":  # python -m benchmarks.real_vocab WHEEL FOLDER (as .ci/run unpacks the models)
    import sys

    unpack_mistral_models(Path(sys.argv[1]), Path(sys.argv[2]))
