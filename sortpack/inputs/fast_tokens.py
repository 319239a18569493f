"""Token ids of text: tiktoken where it provably gives a tokenizer.json's ids, else Hugging Face ``tokenizers``.

A byte-level BPE ``tokenizer.json`` (GPT-2, Llama 3, Qwen, Mistral-Nemo styles) can be run by
tiktoken, several times faster per core, with its ids unchanged, when the conversion is exact.
``exact_conversion`` decides that from the file and the loaded tokenizer, and ``TokenEncoder``
uses tiktoken only then. The conversion is exact when all of these hold (each is checked;
the first that fails is the recorded reason for ``tokenizers``):

- the model is BPE with no dropout, no subword prefix or word suffix, no byte fallback, and
  its vocabulary holds the 256 byte-level characters (so no text has an unknown character);
- no normalizer;
- the pre-tokenizer is ByteLevel(use_regex) or Split(regex, Isolated) then ByteLevel(no regex),
  without add_prefix_space, and the regex is one whose matches the two regex engines
  (Oniguruma in ``tokenizers``, fancy-regex in tiktoken) agree on for every code point: the
  test suite checks each of ``VERIFIED_PATTERNS`` over all of Unicode, and its matches cover
  every character (tiktoken drops what no match covers, ``tokenizers`` keeps it);
- the merges are what tiktoken's rank rule reproduces. tiktoken merges the adjacent pair whose
  concatenation has the lowest id; ``tokenizers`` merges the pair with the earliest merge. Take
  the tokens t that ``tokenizers``' merges turn t's own bytes into (``BPE(t) == [t]``): a merge
  that happens anywhere happens inside the bytes of its result alone, so every merge of any text
  yields such a token, and two tokens adjacent in any text never join into one of them other than
  by its merge. tiktoken's ranks are those tokens (and the 256 bytes); each must come from exactly
  one merge, and ordering them by id must order them by merge. With ``ignore_merges`` (a word
  that is a token is taken whole, as tiktoken does) every token must be such a token;
- the post-processor adds fixed tokens around the text (ByteLevel, TemplateProcessing,
  RobertaProcessing, BertProcessing or a Sequence of them), checked on probe texts;
- the added tokens split first (tiktoken's special tokens): none strips, matches single
  words only, or overlaps another (so either library finds the same occurrences).

With GPT-2's, Llama 3's or Qwen 2's pattern, texts that are all ASCII go through ``kernels.bpe``
instead (no regex engine: the pattern's pieces are found by hand, each merged as tiktoken merges
it), read from the Arrow buffers (``TokenEncoder.encode_column``); the others, and those holding an
added token's text, through tiktoken. Either way the ids are the same, so plans do not record which
encoder ran in anything that ``content_hash`` covers; the manifest's ``provenance.tokenizers`` says
which did and why.
"""
from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..env import env_text

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
_OFF = "SORTPACK_FAST_TOKENIZER"  # "0": always Hugging Face tokenizers; "tiktoken": tiktoken for every text


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
    """What tiktoken needs to give a tokenizer.json's ids: its pattern, ranks, special tokens and the added ids."""

    pattern: str
    ranks: dict[bytes, int]
    special: dict[str, int]
    prefix: tuple[int, ...]  # ids the post-processor puts before the text (add_special_tokens)
    suffix: tuple[int, ...]  # and after it


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


def _model_checks(model: Any) -> None:
    if not isinstance(model, dict) or model.get("type") != "BPE":
        raise Refused("the model is not BPE")
    if model.get("dropout") not in (None, 0, 0.0):
        raise Refused("the BPE model has dropout")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise Refused("the BPE model has a subword prefix or word suffix")
    if model.get("byte_fallback"):
        raise Refused("the BPE model has byte_fallback")


def _merge_pairs(merges: list) -> list[tuple[str, str]]:
    out = []
    for m in merges:
        pair = m.split(" ") if isinstance(m, str) else m
        if len(pair) != 2:
            raise Refused("a merge is not a pair of tokens")
        out.append((pair[0], pair[1]))
    return out


def _whole_tokens(vocab: dict[str, int], merges: list[tuple[str, str]]) -> set[str]:
    """Return the tokens that the model's merges alone turn their own characters into (``BPE(t) == [t]``)."""
    from tokenizers import Tokenizer, models

    bare = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    names = list(vocab)
    got = bare.encode_batch_fast(names, add_special_tokens=False) if hasattr(bare, "encode_batch_fast") \
        else bare.encode_batch(names, add_special_tokens=False)
    return {t for t, e in zip(names, got) if e.ids == [vocab[t]]}


def _ranks(model: dict, added: set[bytes]) -> dict[bytes, int]:
    """Return tiktoken's mergeable ranks for the BPE model (its ids), or refuse when they would merge differently.

    ``added``: the added tokens' contents, split out of every text first, so never a word the model sees.
    """
    vocab: dict[str, int] = model.get("vocab") or {}
    if any(c not in vocab for c in _BYTE_CHARS):
        raise Refused("the vocabulary lacks some of the 256 byte-level characters")
    if len(set(vocab.values())) != len(vocab):
        raise Refused("two vocabulary entries share an id")
    merges = _merge_pairs(model.get("merges") or [])
    # only tokens spelled in the byte-level alphabet can come out of the model
    spelled = {t: raw for t in vocab if (raw := _spelled_bytes(t)) is not None}
    whole = _whole_tokens(vocab, merges)
    if model.get("ignore_merges") and any(t not in whole and raw not in added for t, raw in spelled.items()):
        raise Refused("ignore_merges, and some tokens are not what the merges make of their own bytes")
    made: dict[str, int] = {}  # token -> the index of the merge that makes it
    for k, (a, b) in enumerate(merges):
        t = a + b
        if t in whole:
            if t in made:
                raise Refused(f"two merges make the token {t!r}")
            made[t] = k
    multi = sorted((t for t in whole if t in spelled and len(t) > 1), key=vocab.__getitem__)
    if any(t not in made for t in multi):
        raise Refused("a token is made by no merge")
    order = [made[t] for t in multi]
    if any(x >= y for x, y in zip(order, order[1:])):
        raise Refused("the token ids are not in the order of the merges that make them")
    return {spelled[t]: vocab[t] for t in whole if t in spelled}


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


_MEMO: dict[tuple, Any] = {}  # (path, mtime, size) -> (Encoding, Conversion) or the reason: one decision per process


def _converted(path: str, hf) -> tuple[Any, Conversion] | str:
    """Return tiktoken's Encoding and the conversion of the tokenizer.json at ``path``, or why there is none."""
    try:
        st = os.stat(path)
        key: tuple = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
    except OSError:
        key = (path,)
    if key in _MEMO:
        return _MEMO[key]
    spec = load_spec(path)
    got: Any
    if spec is None:
        got = "the tokenizer file is not JSON"
    else:
        try:
            conv = exact_conversion(spec, hf)
        except Refused as exc:
            got = str(exc)
        else:
            import tiktoken

            got = (tiktoken.Encoding(os.path.basename(path), pat_str=conv.pattern, mergeable_ranks=conv.ranks,
                                     special_tokens=conv.special), conv)
    _MEMO[key] = got
    return got


def _tiktoken_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("tiktoken")
    except Exception:  # noqa: BLE001 - not installed, or metadata unreadable
        return None


_CHOSEN: dict[str, dict] = {}  # tokenizer file name -> the record of the latest TokenEncoder of it in this process


def encoder_provenance(options: dict) -> dict:
    """Return ``{"tokenizers": {file name: record}}`` for the tokenizer ``options`` name, if one was loaded here.

    The ids are the same whichever encoder ran, so the choice belongs in the provenance, out of
    ``content_hash``: a plan's data files and hash are identical with or without tiktoken.
    """
    name = options.get("tokenizer")
    record = _CHOSEN.get(name) if isinstance(name, str) else None
    return {"tokenizers": {name: record}} if record is not None else {}


class TokenEncoder:
    """A loaded tokenizer.json that encodes text columns: tiktoken where exact, else Hugging Face ``tokenizers``.

    Every other attribute is the Hugging Face ``Tokenizer``'s (``encode``, ``token_to_id``, ...),
    so code written for one takes the other. ``engine`` is ``"tiktoken"`` or ``"tokenizers"``;
    ``reason`` why tiktoken is not used (None when it is).
    """

    def __init__(self, hf, path: str):
        self.hf, self.path = hf, path
        self.engine, self.reason = "tokenizers", None
        self._fast: Any = None  # the tiktoken Encoding, when exact
        self._pool: Any = None  # threads for encode_texts (made on first use)
        self._prefix: tuple[int, ...] = ()
        self._suffix: tuple[int, ...] = ()
        self._ascii: Any = None  # (the compiled table of the ranks, the pattern's style) for ASCII texts, if any
        name = os.path.basename(path)
        if env_text(_OFF) == "0":
            self.reason = f"{_OFF}=0"
        elif _tiktoken_version() is None:
            self.reason = "tiktoken is not installed (pip install 'sortpack[fasttok]')"
        else:
            got = _converted(path, hf)
            if isinstance(got, str):
                self.reason = got
            else:
                self._fast, conv = got
                self._allowed = frozenset(conv.special)
                self._prefix, self._suffix = conv.prefix, conv.suffix
                self.engine = "tiktoken"
                self._ascii = _ascii_table(conv)
        _CHOSEN[name] = self.record()

    def __getattr__(self, name: str):
        if name == "hf" or name.startswith("__"):
            # not yet set (unpickling, copying): never look it up through itself
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __reduce__(self):
        """Return how to rebuild this encoder in another process (its thread pool is not sent)."""
        return TokenEncoder, (self.hf, self.path)

    def record(self) -> dict:
        """Return what the manifest's provenance says of this encoder."""
        out: dict[str, Any] = {"encoder": self.engine}
        if self.engine == "tiktoken":
            out["tiktoken"] = _tiktoken_version()
            if self._ascii is not None:
                out["ascii"] = "compiled"  # ASCII texts through kernels.bpe, the same ids
        else:
            import tokenizers

            out["tokenizers"] = tokenizers.__version__
            out["why"] = self.reason
        return out

    def encode_texts(self, texts: list[str], special_tokens: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Return (every text's ids in order as one int32 array, each text's count as int64): ``encode``'s ids."""
        if self._fast is None:
            return hf_ids(self.hf, texts, special_tokens)
        threads = _threads()
        if threads > 1 and len(texts) >= 2 * threads:
            # tiktoken lets go of the GIL while it encodes: contiguous runs of about equal characters
            ends = np.searchsorted(np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts))),
                                   np.arange(1, threads) * (sum(map(len, texts)) / threads))
            runs = [texts[a:b] for a, b in zip([0, *ends.tolist()], [*ends.tolist(), len(texts)])]
            done = list(self._threads_pool(threads).map(self._encode_run, runs))
            ids = np.concatenate([d[0] for d in done])
            counts = np.concatenate([d[1] for d in done])
        else:
            ids, counts = self._encode_run(texts)
        if special_tokens and (self._prefix or self._suffix):
            ids, counts = _surround(ids, counts, self._prefix, self._suffix)
        return ids, counts

    def _threads_pool(self, threads: int) -> Any:
        """Return this encoder's pool of ``threads`` threads (made on first use)."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="sortpack-tiktoken")
        return self._pool

    def encode_column(self, col: Any, special_tokens: bool = True, keep: bool = True
                      ) -> tuple[np.ndarray | None, np.ndarray] | None:
        """Return (the ids of a string array's texts as one int32 array, None when not ``keep``; their counts)
        through the compiled ASCII path (``kernels.bpe``), its other texts through ``encode_texts``; None where
        that path does not apply (no compiled table, nulls, not a plain string array)."""
        import pyarrow as pa

        if self._ascii is None or col.null_count or not (pa.types.is_string(col.type)
                                                        or pa.types.is_large_string(col.type)):
            return None
        if not len(col):
            return (np.zeros(0, np.int32) if keep else None), np.zeros(0, np.int64)
        from ..kernels import bpe

        wide = pa.types.is_large_string(col.type)
        bufs = col.buffers()
        offsets = np.frombuffer(bufs[1], np.int64 if wide else np.int32, len(col) + 1, col.offset * (8 if wide else 4))
        data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and bufs[2].size else np.zeros(1, np.uint8)
        # a text holding a special token's text goes to tiktoken, which finds it; any other is plain text
        skip = _holding(col, self._allowed) if self._allowed else None
        offsets = offsets.astype(np.int64)
        threads, n = _threads(), len(col)
        # contiguous runs of about equal bytes: at most _RUN_BYTES each (a run's id buffer is 4 bytes per byte),
        # and one per thread at least, as the kernel lets go of the GIL (ctypes)
        size = int(offsets[-1] - offsets[0])
        runs_n = max(threads if threads > 1 and n >= 2 * threads else 1, -(-size // _RUN_BYTES))
        inner = np.searchsorted(offsets, np.linspace(offsets[0], offsets[-1], runs_n + 1)[1:-1])
        cuts = np.unique(np.concatenate(([0], inner, [n])))
        runs = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))

        tab, style = self._ascii

        def run(ab: tuple[int, int]) -> Any:
            a, b = ab
            return bpe.encode_ascii(tab, style, data, offsets[a:b + 1], None if skip is None else skip[a:b], keep)

        done = list(self._threads_pool(threads).map(run, runs)) if len(runs) > 1 else [run(runs[0])]
        if any(d is None for d in done):
            self._ascii = None  # not byte-level after all, or no memory: tiktoken from here on
            return None
        counts = np.concatenate([d[1] for d in done])
        ids = np.concatenate([d[0] for d in done]) if keep else None
        tiktokens = counts < 0
        left = np.flatnonzero(tiktokens)
        if len(left):
            got = [self.encode_texts(col.take(pa.array(left[a:a + 4096])).to_pylist(), special_tokens=False)
                   for a in range(0, len(left), 4096)]
            more, counts[left] = np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])
            if ids is not None:
                theirs = np.repeat(tiktokens, counts)
                merged = np.empty(len(theirs), np.int32)
                merged[theirs], merged[~theirs] = more, ids
                ids = merged
        if special_tokens and (self._prefix or self._suffix):
            if ids is None:
                counts = counts + len(self._prefix) + len(self._suffix)
            else:
                ids, counts = _surround(ids, counts, self._prefix, self._suffix)
        return ids, counts

    def _encode_run(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Return (the ids as one int32 array, the counts) of texts encoded one after another in this thread."""
        if not self._allowed:
            # no added tokens: tiktoken's special-token search would look for an empty pattern at every
            # position (1.6x the time); its plain encode gives the same ids as lists
            lists = list(map(self._fast.encode_ordinary, texts))
            counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
            return np.fromiter(itertools.chain.from_iterable(lists), np.int32, int(counts.sum())), counts
        encode, allowed = self._fast.encode_to_numpy, self._allowed
        parts = [encode(t, allowed_special=allowed, disallowed_special=()) for t in texts]
        counts = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        return (np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)), counts


_RUN_BYTES = 1 << 24  # text bytes the compiled path encodes per call
_TABLES: dict[int, Any] = {}  # id of a memoised Conversion -> its compiled table (one per process)


def _ascii_table(conv: Conversion) -> Any:
    """Return (the compiled table of ``conv``'s ranks, its pattern's style) where the kernel splits by that pattern
    (None: tiktoken alone)."""
    from ..kernels import bpe

    style = next((name for name, pattern in VERIFIED_PATTERNS.items() if pattern == conv.pattern), None)
    if style not in bpe.STYLES or env_text(_OFF) == "tiktoken":
        return None
    if id(conv) not in _TABLES:
        _TABLES[id(conv)] = bpe.table(conv.ranks)
    return None if _TABLES[id(conv)] is None else (_TABLES[id(conv)], style)


_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def _holding(col: Any, texts: frozenset[str]) -> np.ndarray:
    """Return, per string of ``col``, whether it holds any of ``texts`` (uint8): one pass of an alternation of
    them (a tokenizer may have hundreds of added tokens)."""
    import pyarrow.compute as pc

    pattern = "|".join("".join("\\" + c if c in _RE2_SPECIAL else c for c in t) for t in sorted(texts))
    return pc.match_substring_regex(col, pattern).to_numpy(zero_copy_only=False).astype(np.uint8)


def _threads() -> int:
    """Return the threads a rank encodes with: ``RAYON_NUM_THREADS`` (the CLI sets cores / ranks), else the cores."""
    from ..env import env_int

    try:
        return max(env_int("RAYON_NUM_THREADS") or os.cpu_count() or 1, 1)
    except ValueError:
        return 1


def _surround(ids: np.ndarray, counts: np.ndarray, prefix: tuple[int, ...], suffix: tuple[int, ...]
              ) -> tuple[np.ndarray, np.ndarray]:
    """Return the ids with ``prefix`` before and ``suffix`` after every text's, and the new counts."""
    a, b = len(prefix), len(suffix)
    new = counts + a + b
    out = np.empty(int(new.sum()), np.int32)
    starts = np.cumsum(new) - new
    # each text's ids land after its prefix: shift every id by the added tokens before its text
    text_of = np.repeat(np.arange(len(counts)), counts)
    out[np.arange(len(ids)) + (a + (a + b) * text_of)] = ids
    for k, t in enumerate(prefix):
        out[starts + k] = t
    for k, t in enumerate(suffix):
        out[starts + new - b + k] = t
    return out, new


def hf_ids(hf, texts: list[str], special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
    """Return (ids as one int32 array, counts) of ``texts`` from Hugging Face ``tokenizers``' batch encode."""
    encode = getattr(hf, "encode_batch_fast", hf.encode_batch)
    ids = [e.ids for e in encode(texts, add_special_tokens=special_tokens)]
    counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(counts.sum()))
    return flat, counts


def load_spec(path: str) -> dict | None:
    """Return the parsed tokenizer.json at ``path`` (None when it is not JSON)."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None


def token_ids(tokenizer, col: Any, special_tokens: bool = True, keep: bool = True
              ) -> tuple[Any, np.ndarray]:
    """Return the token ids (list<int32>) of a text column and their counts, from one encode per text.

    The ids are exactly what ``tokens`` counts (the same encode, with or without the special
    tokens as ``--special-tokens`` says), so ``len(ids) == size``. ``keep=False``: the counts
    only (the list is empty). An encoder with a compiled path (``TokenEncoder.encode_column``) reads
    each chunk's texts from its Arrow buffers; otherwise texts go to the encoder as Python strings
    4096 at a time. Ids stay in numpy arrays.
    """
    import pyarrow as pa

    from ..arrow_types import plain_column

    encode = getattr(tokenizer, "encode_texts", None)
    if encode is None:  # a bare tokenizers.Tokenizer
        def encode(texts, special):
            return hf_ids(tokenizer, texts, special)
    whole = getattr(tokenizer, "encode_column", None)
    counts, values = [np.zeros(0, np.int64)], [np.zeros(0, np.int32)]
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    for chunk in chunks:
        chunk = plain_column(chunk)
        got = whole(chunk, special_tokens, keep) if whole is not None else None
        if got is not None:  # encoded from its Arrow buffers (the compiled path)
            counts.append(got[1])
            if keep:
                values.append(got[0])
            continue
        for a in range(0, len(chunk), 4096):
            ids, n = encode(chunk.slice(a, 4096).to_pylist(), special_tokens)
            counts.append(n)
            if keep:
                values.append(ids)
    sizes = np.concatenate(counts)
    if not keep:
        return pa.array([], pa.list_(pa.int32())), sizes
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(values), pa.int32())), sizes
