"""A proven tokenizer conversion kept on disk by the tokenizer file's content: later jobs and ranks skip the proof.

Two kinds of entry: tiktoken's (``bpe-KEY``, below) and the compiled SentencePiece-style BPE's
(``sp-KEY``: ``sp_conversion.SpConversion``'s arrays, and why tiktoken refused the file), which
spares a later job the file's JSON parse, the ``tokenizers`` parse and the merges' conversion
(about 0.5 s per rank for Mistral's 32k vocabularies), the same way.

``bpe_conversion.exact_conversion`` proves from a ``tokenizer.json`` that tiktoken gives its ids
(about 0.5 s per rank for a 50k vocabulary, more for 128k). Its result depends only on the file's
bytes, this module's format and the ``tokenizers`` release the proof ran against, so it is kept
under that key (a sha256) in ``SORTPACK_CACHE_DIR`` (default ``$XDG_CACHE_HOME/sortpack``, else
``~/.cache/sortpack``; ``0`` turns it off). A refused file is not kept: it is proven again.

Never wrong ids: an entry is read only when its header names the same key and the sha256 of its
header fields and body matches; anything else (missing, truncated, another format) is proven again and written
anew. Entries are written to a temporary name and renamed, so ranks writing the same entry at
once leave one whole file; an unwritable directory only means no cache. sortpack removes nothing
here but its own temporary file after a failed write.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..env import env_text
from .bpe_conversion import Conversion

FORMAT = 1  # bump when the conversion's proof or this layout changes: old entries are then never read
_MAGIC = b"sortpack-bpe-conversion\n"
_SP_MAGIC = b"sortpack-sp-conversion\n"


def cache_dir() -> Path | None:
    """Return the directory entries live in (None: ``SORTPACK_CACHE_DIR=0``, the cache is off)."""
    given = env_text("SORTPACK_CACHE_DIR")
    if given == "0":
        return None
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sortpack"


def entry_key(raw: bytes) -> str:
    """Return the key of a tokenizer file's entry: its bytes, this format and the ``tokenizers`` release."""
    import tokenizers

    h = hashlib.sha256(raw)
    h.update(f"\0{FORMAT}\0{tokenizers.__version__}".encode())
    return h.hexdigest()


def _read(name: str, magic: bytes, key: str) -> tuple[dict, bytes] | None:
    """Return (the header, the body) of the entry ``name`` (None: the cache is off, no such entry, or not whole and
    matching: another magic or key, a digest that does not match, a header that is no JSON)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        data = (folder / name).read_bytes()
    except OSError:
        return None
    if not data.startswith(magic):
        return None
    head_end = data.find(b"\n", len(magic))
    try:
        head = json.loads(data[len(magic):head_end])
    except ValueError:
        return None
    body = data[head_end + 1:]
    if not isinstance(head, dict) or head.get("key") != key or head.pop("sha256", None) != _digest(head, body):
        return None
    return head, body


def _load(name: str, magic: bytes, key: str, parse: Callable[[dict, bytes], Any]) -> Any:
    """Return ``parse(head, body)`` of the entry ``name`` (None: no whole, matching entry, or ``parse`` finds its
    body damaged)."""
    got = _read(name, magic, key)
    if got is None:
        return None
    try:
        return parse(*got)
    except (ValueError, KeyError, TypeError):  # a damaged entry is converted again, never read
        return None


def load(key: str) -> Conversion | None:
    """Return the conversion kept under ``key`` (None: no whole, matching entry)."""
    return _load(f"bpe-{key}", _MAGIC, key, _parsed)


def _parsed(head: dict, body: bytes) -> Conversion | None:
    """Return the conversion a whole entry's header and body hold (None: its body is not what the header says)."""
    n = int(head["tokens"])
    lengths = np.frombuffer(body, np.int64, n, 0)
    ids = np.frombuffer(body, np.int64, n, 8 * n)
    ends = np.cumsum(lengths).tolist()
    blob = body[16 * n:]
    if (ends[-1] if ends else 0) != len(blob):
        return None
    ranks = dict(zip((blob[a:b] for a, b in zip([0, *ends[:-1]], ends)), ids.tolist()))
    return Conversion(head["pattern"], ranks, dict(head["special"]), tuple(head["prefix"]), tuple(head["suffix"]))


def _digest(head: dict, body: bytes) -> str:
    """Return the sha256 of an entry's header fields and body: any change to either is seen."""
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode() + b"\0" + body).hexdigest()


def store(key: str, conv: Conversion) -> None:
    """Keep ``conv`` under ``key`` (nothing when the cache is off or its directory cannot be written)."""
    tokens = list(conv.ranks)
    lengths = np.fromiter(map(len, tokens), np.int64, len(tokens))
    ids = np.fromiter(conv.ranks.values(), np.int64, len(tokens))
    body = lengths.tobytes() + ids.tobytes() + b"".join(tokens)
    _write(f"bpe-{key}", _MAGIC, {"key": key, "format": FORMAT, "tokens": len(tokens), "pattern": conv.pattern,
                                  "special": conv.special, "prefix": list(conv.prefix), "suffix": list(conv.suffix)},
           body)


def _write(name: str, magic: bytes, head: dict, body: bytes) -> None:
    """Write the entry ``name`` whole in the cache directory: ``magic``, then ``head`` with the digest of it and of
    ``body``, then ``body`` (nothing when the cache is off or its directory cannot be written)."""
    data = magic + json.dumps({**head, "sha256": _digest(head, body)}).encode() + b"\n" + body
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, folder / name)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # ours: a disk full leaves no half entry behind


_SP_ARRAYS = (("cps", np.int32), ("ids", np.int32), ("byte_ids", np.int32), ("merges", np.int32),
              ("bigrams", np.uint64))


def store_sp(key: str, conv, reason: str) -> None:
    """Keep a SentencePiece-style conversion (``sp_conversion.SpConversion``) and why tiktoken refused its file."""
    vocab = conv.vocab
    arrays = {"cps": np.fromiter(map(ord, vocab.chars), np.int32, len(vocab.chars)),
              "ids": np.fromiter(vocab.chars.values(), np.int32, len(vocab.chars)),
              "byte_ids": vocab.byte_ids, "merges": vocab.merges,
              "bigrams": np.zeros(0) if vocab.bigrams is None else vocab.bigrams}
    arrays = {name: np.ascontiguousarray(arrays[name], dtype).ravel() for name, dtype in _SP_ARRAYS}
    body = b"".join(arrays[name].tobytes() for name, _ in _SP_ARRAYS)
    head = {"key": key, "format": FORMAT, "sizes": [len(arrays[name]) for name, _ in _SP_ARRAYS],
            "bigrams": vocab.bigrams is not None, "replacement": vocab.replacement, "prepend": vocab.prepend,
            "after_added": conv.after_added, "special": conv.special, "plain": sorted(conv.plain),
            "prefix": list(conv.prefix), "suffix": list(conv.suffix), "reason": reason}
    _write(f"sp-{key}", _SP_MAGIC, head, body)


def load_sp(key: str):
    """Return (the SentencePiece-style conversion kept under ``key``, why tiktoken refused its file); None: no whole,
    matching entry."""
    return _load(f"sp-{key}", _SP_MAGIC, key, _parsed_sp)


def _parsed_sp(head: dict, body: bytes):
    """Return what a whole ``sp-`` entry's header and body hold (None: its body is not what the header says)."""
    from ..kernels.sp_bpe import SpVocab
    from .sp_conversion import SpConversion

    arrays, at = {}, 0
    for (name, dtype), n in zip(_SP_ARRAYS, head["sizes"]):
        arrays[name] = np.frombuffer(body, dtype, n, at)
        at += n * np.dtype(dtype).itemsize
    if at != len(body) or len(arrays["byte_ids"]) != 256 or len(arrays["merges"]) % 3:
        return None
    vocab = SpVocab(dict(zip(map(chr, arrays["cps"].tolist()), arrays["ids"].tolist())), arrays["byte_ids"].tolist(),
                    arrays["merges"].reshape(-1, 3), head["replacement"], int(head["prepend"]),
                    arrays["bigrams"] if head["bigrams"] else None)
    conv = SpConversion(vocab, {str(k): int(v) for k, v in head["special"].items()}, tuple(head["prefix"]),
                        tuple(head["suffix"]), int(head["after_added"]), frozenset(head["plain"]), cached=True)
    return conv, str(head["reason"])
