"""The tiktoken conversion of a byte-level BPE ``tokenizer.json``, made only where it provably gives the file's ids.

``exact_conversion(spec, hf)`` returns a ``Conversion`` (tiktoken's pattern, ranks and special
tokens, the ids the post-processor adds) or raises ``Refused`` with the first condition that fails:

- the model is BPE with no dropout, no subword prefix or word suffix, no byte fallback, and its
  vocabulary holds the 256 byte-level characters (so no text has an unknown character);
- no normalizer;
- the pre-tokenizer is ByteLevel(use_regex) or Split(regex, Isolated) then ByteLevel(no regex),
  without add_prefix_space, and the regex is one whose matches the two regex engines (Oniguruma
  in ``tokenizers``, fancy-regex in tiktoken) agree on for every code point: the test suite checks
  each of ``VERIFIED_PATTERNS`` over all of Unicode, and its matches cover every character
  (tiktoken drops what no match covers, ``tokenizers`` keeps it);
- the merges are what tiktoken's rank rule reproduces (``_ranks``, proof below);
- the post-processor adds fixed tokens around the text (ByteLevel, TemplateProcessing,
  RobertaProcessing, BertProcessing or a Sequence of them), checked on probe texts;
- the added tokens split first (tiktoken's special tokens): none strips, matches single words
  only, or overlaps another (so either library finds the same occurrences).

The merge rule. Both libraries merge a piece's parts one pair at a time, the leftmost of equals
first: ``tokenizers`` the adjacent pair listed earliest among its merges, tiktoken the adjacent pair
whose concatenation has the lowest id among its ranks. Write BPE(t) for what ``tokenizers``' merges
make of the characters of t alone. *Lemma*: if parts x and y are ever adjacent in a piece, BPE(x+y)
passes through [x, y]: no merge ever crossed the span of x+y (x and y are parts), and each merge
inside it was the lowest pair of the piece, so the lowest pair of the span alone; the span alone makes
the same merges in the same order. So where the two libraries' parts have been equal so far:

- a pair x, y joins into a token t = x+y in ``tokenizers`` only by the merge that BPE(t) makes last,
  and then BPE(t) = [t] (t is *whole*); every other merge making t is never used;
- tiktoken joins x, y exactly when t is one of its ranks. Its ranks are the whole tokens (and the 256
  bytes), so a tiktoken join is a ``tokenizers`` join, and the other way round;
- both take the same pair first when ordering the whole tokens by id orders the merges that make
  them: every merge making one comes before every merge making the next (one merge each, as
  ``tokenizers`` trains them, or several grouped, as the converters from tiktoken's files list them).

With ``ignore_merges`` ``tokenizers`` first takes a piece that is a vocabulary token whole, as
tiktoken does with its ranks, so every token spelled in bytes is a rank. A token t that is not whole
then takes part in tiktoken's merging too; by the lemma two parts that join into it are BPE(t)'s
parts, so it changes nothing unless BPE(t) is exactly two parts (which ``tokenizers`` never joins):
such a token is refused. Meta's Llama 3 file (588 tokens reachable only whole, 90,639 made by more
than one merge) and the other files converted from tiktoken's (every two-token split of a token is a
merge, so no BPE(t) is two parts) pass.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The regex the ByteLevel pre-tokenizer uses with use_regex (GPT-2's), as tokenizers writes it
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Split regexes of the well-known byte-level tokenizers (as their tokenizer.json files spell them) that
# tests/inputs/test_fast_tokens.py checks over every code point with both regex engines
VERIFIED_PATTERNS = {
    "gpt2": GPT2_PATTERN,
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+",
    "tekken": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
              r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_PROCESSORS = ("ByteLevel", "TemplateProcessing", "RobertaProcessing", "BertProcessing")
_PROBES = ("", "a", "hello world", " \n\t x1 ")


def byte_chars() -> dict[str, int]:
    """Return the byte-level alphabet: each of its 256 characters -> the byte it stands for (GPT-2's table)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


@dataclass(frozen=True)
class Conversion:
    """What tiktoken needs to give a tokenizer.json's ids: its pattern, ranks, special tokens and the added ids.

    ``compiled()`` is the ranks' table for ``kernels.bpe``, made once on first use and kept here (with the
    code point classes where the installed ``tokenizers`` has them: ``unicode_classes.same_as_tokenizers``).
    """

    pattern: str
    ranks: dict[bytes, int]
    special: dict[str, int]
    prefix: tuple[int, ...]  # ids the post-processor puts before the text (add_special_tokens)
    suffix: tuple[int, ...]  # and after it
    _table: list = field(default_factory=list, init=False, repr=False, compare=False)  # [] or [the table]
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    @property
    def style(self) -> str | None:
        """Return the name of the pattern in ``VERIFIED_PATTERNS`` (None: another one)."""
        return next((name for name, pattern in VERIFIED_PATTERNS.items() if pattern == self.pattern), None)

    def compiled(self) -> Any:
        """Return the compiled table of the ranks (``kernels.bpe.table``; None without the compiled kernels)."""
        with self._lock:  # encoders in several threads share one conversion: one table
            if not self._table:
                from ..kernels import bpe
                from ..kernels.unicode_classes import same_as_tokenizers

                # beyond ASCII only where the installed tokenizers has the classes the kernel splits by
                self._table.append(bpe.table(self.ranks, unicode=same_as_tokenizers() is None))
            return self._table[0]


class Refused(Exception):
    """The conversion is not exact; the message says why."""


def _pattern(pre: Any) -> str:
    """Return the regex a byte-level pre-tokenizer splits with, or refuse."""
    def byte_level(p: Any, regex: bool) -> None:
        if not isinstance(p, dict) or p.get("type") != "ByteLevel":
            raise Refused("the pre-tokenizer is not byte-level")
        if p.get("add_prefix_space"):
            raise Refused("the ByteLevel pre-tokenizer adds a prefix space")
        if bool(p.get("use_regex", True)) is not regex:
            raise Refused("the ByteLevel pre-tokenizer's use_regex does not match its place")

    if isinstance(pre, dict) and pre.get("type") == "ByteLevel":
        byte_level(pre, True)
        return GPT2_PATTERN
    parts = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else None
    if not parts or len(parts) != 2:
        raise Refused("the pre-tokenizer is neither ByteLevel nor Sequence[Split, ByteLevel]")
    split, last = parts
    byte_level(last, False)
    if not isinstance(split, dict) or split.get("type") != "Split" or split.get("behavior") != "Isolated" \
            or split.get("invert") or not isinstance(split.get("pattern"), dict) or "Regex" not in split["pattern"]:
        raise Refused("the pre-tokenizer's split is not an isolating regex Split")
    pattern = split["pattern"]["Regex"]
    if pattern not in VERIFIED_PATTERNS.values():
        raise Refused("the pre-tokenizer's regex is not one verified to match alike in both regex engines")
    return pattern


def plain_bpe_checks(model: Any) -> None:
    """Refuse a model that is not BPE, or has dropout, a subword prefix or a word suffix (no compiled path runs
    those; ``sp_conversion`` shares these checks)."""
    if not isinstance(model, dict) or model.get("type") != "BPE":
        raise Refused("the model is not BPE")
    if model.get("dropout") not in (None, 0, 0.0):
        raise Refused("the BPE model has dropout")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise Refused("the BPE model has a subword prefix or word suffix")


def _model_checks(model: Any) -> None:
    plain_bpe_checks(model)
    if model.get("byte_fallback"):
        raise Refused("the BPE model has byte_fallback")


def _merge_pairs(merges: list) -> list[tuple[str, str]]:
    pairs = [tuple(m.split(" ") if isinstance(m, str) else m) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise Refused("a merge is not a pair of tokens")
    return pairs


def _own_parts(vocab: dict[str, int], merges: list[tuple[str, str]]) -> dict[str, int]:
    """Return, per token, how many parts the model's merges alone leave of its own characters (1: BPE(t) == [t])."""
    from tokenizers import models

    tokenize = models.BPE(vocab=vocab, merges=merges, ignore_merges=False).tokenize
    out = {}
    for t, i in vocab.items():
        got = tokenize(t)
        out[t] = 1 if len(got) == 1 and got[0].id == i else max(len(got), 2)
    return out


def _check_merge_order(vocab: dict[str, int], merges: list[tuple[str, str]], whole: set[str]) -> None:
    """Refuse unless ordering the whole tokens by id orders the merges that make them (each token's as a group)."""
    ids = np.array(sorted(vocab[t] for t in whole if len(t) > 1), np.int64)
    made = np.fromiter((vocab.get(a + b, -1) for a, b in merges), np.int64, len(merges))
    step = np.flatnonzero(np.isin(made, ids))  # the merges making whole tokens, in merge order
    which = np.searchsorted(ids, made[step])  # each one's token, by its place in id order
    first = np.full(len(ids), len(merges))
    last = np.full(len(ids), -1)
    np.minimum.at(first, which, step)
    np.maximum.at(last, which, step)
    if (last < 0).any():
        raise Refused("a token is made by no merge")
    if (last[:-1] >= first[1:]).any():
        raise Refused("the token ids are not in the order of the merges that make them")


def _checked_vocab(model: dict) -> dict[str, int]:
    """Return the model's vocabulary, refused where a text could hold an unknown byte or two tokens share an id."""
    vocab: dict[str, int] = model.get("vocab") or {}
    if any(c not in vocab for c in _BYTE_CHARS):
        raise Refused("the vocabulary lacks some of the 256 byte-level characters")
    if len(set(vocab.values())) != len(vocab):
        raise Refused("two vocabulary entries share an id")
    return vocab


def _spelled(vocab: dict[str, int], merges: list[tuple[str, str]]
             ) -> tuple[dict[str, bytes], dict[str, int], list[tuple[str, str]]]:
    """Return the tokens spelled in the byte-level alphabet (-> their bytes), and the vocabulary and merges of them:
    only those can come out of the model (an empty token never does)."""
    spelled = {t: raw for t in vocab if (raw := _spelled_bytes(t))}
    if len(spelled) == len(vocab):
        return spelled, vocab, merges
    return spelled, {t: vocab[t] for t in spelled}, [m for m in merges if m[0] in spelled and m[1] in spelled]


def _whole_word_ranks(spelled: dict[str, bytes], vocab: dict[str, int], parts: dict[str, int],
                      added: set[bytes]) -> dict[bytes, int]:
    """Return the ranks of an ``ignore_merges`` model: every token a piece can be, refused where two tokens the merges
    make would join into one they do not make."""
    for t, raw in spelled.items():
        if parts[t] == 2 and raw not in added:
            raise Refused(f"ignore_merges, and the token {t!r} is not what the merges make of its bytes, "
                          "yet two tokens they make join into it")
    return {raw: vocab[t] for t, raw in spelled.items() if parts[t] == 1 or raw not in added}


def _ranks(model: dict, added: set[bytes]) -> dict[bytes, int]:
    """Return tiktoken's mergeable ranks for the BPE model (its ids), or refuse when they would merge differently.

    ``added``: the added tokens' contents, split out of every text first, so never a piece the model sees.
    """
    spelled, vocab, merges = _spelled(_checked_vocab(model), _merge_pairs(model.get("merges") or []))
    parts = _own_parts(vocab, merges)
    whole = {t for t, n in parts.items() if n == 1}
    _check_merge_order(vocab, merges, whole)
    if model.get("ignore_merges"):
        return _whole_word_ranks(spelled, vocab, parts, added)
    return {spelled[t]: vocab[t] for t in whole}


# each byte-level character -> the character of its byte; the other characters below U+0144 -> one above U+00FF
_BYTE_CHARS = byte_chars()
_TO_LATIN1 = {ord(c): chr(b) for c, b in _BYTE_CHARS.items()} | \
    {c: "\uffff" for c in range(0x144) if chr(c) not in _BYTE_CHARS}


def _spelled_bytes(token: str) -> bytes | None:
    """Return the bytes a token spelled in the byte-level alphabet stands for (None: not spelled in it)."""
    try:
        return token.translate(_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        return None


def _special(added: list) -> dict[str, int]:
    """Return the added tokens (content -> id) for tiktoken to split first, or refuse where it would split otherwise."""
    special: dict[str, int] = {}
    for a in added:
        content = a.get("content") or ""
        if not content:
            raise Refused("an added token is empty")
        if a.get("lstrip") or a.get("rstrip") or a.get("single_word"):
            raise Refused(f"the added token {content!r} strips or matches single words only")
        special[content] = int(a["id"])
    names = list(special)
    # no occurrence of one added token may overlap another's: then any scan finds the same ones
    for x in names:
        if any(x != y and x in y for y in names):
            raise Refused(f"the added token {x!r} is part of another")
    prefixes = {y[:k] for y in names for k in range(1, len(y))}
    for x in names:
        if any(x[k:] in prefixes for k in range(1, len(x))):
            raise Refused(f"the added token {x!r} ends as another begins")
    return special


def _post_processor(proc: Any) -> None:
    if proc is None:
        return
    kinds = [p.get("type") for p in proc.get("processors", [])] if proc.get("type") == "Sequence" \
        else [proc.get("type")]
    if any(k not in _PROCESSORS for k in kinds):
        raise Refused("the post-processor is not one that only adds fixed tokens around the text")


def _around(hf) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Return the ids the post-processor adds before and after a text, checked to be the same on every probe."""
    found = None
    for text in _PROBES:
        bare, full = hf.encode(text, add_special_tokens=False).ids, hf.encode(text, add_special_tokens=True).ids
        starts = [k for k in range(len(full) - len(bare) + 1) if full[k:k + len(bare)] == bare]
        cuts = {(tuple(full[:k]), tuple(full[k + len(bare):])) for k in starts}
        found = cuts if found is None else found & cuts
    if not found or len(found) != 1:
        raise Refused("the post-processor's tokens depend on the text")
    return next(iter(found))


def exact_conversion(spec: dict, hf) -> Conversion:
    """Return the tiktoken conversion of the tokenizer.json ``spec`` (``hf`` is it loaded), or raise ``Refused``."""
    if spec.get("normalizer") is not None:
        raise Refused("the tokenizer has a normalizer")
    _model_checks(spec.get("model"))
    pattern = _pattern(spec.get("pre_tokenizer"))
    _post_processor(spec.get("post_processor"))
    if getattr(hf, "encode_special_tokens", False):
        raise Refused("the tokenizer encodes its special tokens as text")
    special = _special(spec.get("added_tokens") or [])
    ranks = _ranks(spec["model"], {c.encode("utf-8") for c in special})
    prefix, suffix = _around(hf)
    return Conversion(pattern, ranks, special, prefix, suffix)


def file_key(path: str) -> tuple:
    """Return what names a tokenizer file's version in a process's memo of decisions: its real path, mtime and size."""
    try:
        st = os.stat(path)
        return os.path.realpath(path), st.st_mtime_ns, st.st_size
    except OSError:
        return (path,)


def load_spec(path: str) -> dict | None:
    """Return the parsed tokenizer.json at ``path`` (None when it is not JSON)."""
    try:
        with open(path, "rb") as f:
            return parse_spec(f.read())
    except OSError:
        return None


def parse_spec(raw: bytes) -> dict | None:
    """Return a tokenizer.json's bytes parsed (None when they are not a JSON object)."""
    try:
        spec = json.loads(raw)
    except ValueError:  # not UTF-8 or not JSON
        return None
    return spec if isinstance(spec, dict) else None
