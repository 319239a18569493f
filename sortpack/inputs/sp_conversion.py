"""Whether the compiled SentencePiece-style BPE (``kernels.sp_bpe``) gives a tokenizer.json's ids, and its table.

Mistral 7B's and Llama 2's files (and others converted from SentencePiece BPE models) have no
pre-tokenizer: tiktoken cannot run them (``bpe_conversion`` refuses them for their byte fallback),
and ``tokenizers`` merges a whole document as one word. ``sp_conversion(spec, hf)`` returns a
``SpConversion`` or raises ``Refused`` with the first condition that fails:

- the model is BPE with byte fallback and the 256 ``<0xHH>`` tokens, no dropout, no subword prefix or
  word suffix, no ``ignore_merges``; every merge's two parts and what they make are tokens;
- the text reaches the model in one of the two shapes the converters write: a normalizer that is
  ``Replace(" ", R)``, alone or after ``Prepend(R)``, and no pre-tokenizer; or no normalizer and a
  ``Metaspace(R, split=False)`` pre-tokenizer (R one character). The kernel replaces spaces by R and
  prepends R as each shape does (Prepend: before every non-empty text; Metaspace: unless the text
  starts with R, and not with ``prepend_scheme="never"``);
- the added tokens are matched in the raw text (``normalized`` false): a text holding one's text is
  left to ``tokenizers``, every other text has no added token and is one word;
- the post-processor adds fixed tokens around the text (as for the tiktoken conversion).

The merge itself is ``tokenizers``' own algorithm (``_spbpe.c``); the probe texts are encoded both
ways as a last check.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .bpe_conversion import Refused, _around, _post_processor, file_key, load_spec, plain_bpe_checks

_MEMO: dict[tuple, Any] = {}  # (path, mtime, size) -> its SpConversion or the reason: one decision per process
_MEMO_LOCK = threading.Lock()
_PROBES = ("", " ", "a", "hello world", "  two  spaces \n\t x1 ", "\u2581lead", "héllo wörld 日本語 🤗 \x00")


def _replacement(normalizer: Any, pre: Any) -> tuple[str, int, int]:
    """Return (what a space becomes, where a text gets it in front, where a text after an added token does:
    ``kernels.sp_bpe``'s NEVER/ALWAYS/UNLESS_THERE)."""
    from ..kernels.sp_bpe import ALWAYS, NEVER, UNLESS_THERE

    if normalizer is not None:
        if pre is not None:
            raise Refused("the tokenizer has both a normalizer and a pre-tokenizer")
        steps = normalizer.get("normalizers") if normalizer.get("type") == "Sequence" else [normalizer]
        if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
            raise Refused("the normalizer is not a space replacement")
        replace = steps[-1]
        r = replace.get("content")
        if replace.get("type") != "Replace" or replace.get("pattern") != {"String": " "} or \
                not isinstance(r, str) or len(r) != 1:
            raise Refused("the normalizer is not Replace(' ', one character), alone or after Prepend")
        if len(steps) == 1:
            return r, NEVER, NEVER
        if len(steps) == 2 and steps[0].get("type") == "Prepend" and steps[0].get("prepend") == r:
            return r, ALWAYS, ALWAYS  # the normalizer runs on each text between added tokens
        raise Refused("the normalizer is not Replace(' ', one character), alone or after Prepend")
    if not isinstance(pre, dict) or pre.get("type") != "Metaspace":
        raise Refused("the tokenizer has no space replacement (a Metaspace pre-tokenizer or a Replace normalizer)")
    r = pre.get("replacement")
    if not isinstance(r, str) or len(r) != 1:
        raise Refused("the Metaspace replacement is not one character")
    if pre.get("split", True):
        raise Refused("the Metaspace pre-tokenizer splits words")
    scheme = pre.get("prepend_scheme")
    if scheme is None:  # files written before prepend_scheme
        scheme = "always" if pre.get("add_prefix_space", True) else "never"
    if scheme not in ("always", "first", "never"):
        raise Refused(f"the Metaspace prepend_scheme {scheme!r} is not known")
    # "first": only where the text starts at the input's first character, so never after an added token
    return r, NEVER if scheme == "never" else UNLESS_THERE, UNLESS_THERE if scheme == "always" else NEVER


def _merge_ids(merges: Any, keys: Any, ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Return the merges as (left, right, made) id rows and the tokens they make, in whole-column calls (a Python loop
    over 60k-280k merges took most of a file's load); refuse a merge that is not two tokens or makes none."""
    import pyarrow as pa

    from .. import arrow_compute as ac

    if not merges:
        return np.zeros((0, 3), np.int32), []
    try:
        if all(isinstance(m, str) for m in merges):
            parts = ac.split_pattern(pa.array(merges, pa.string()), " ")
        else:
            parts = pa.array(merges, pa.list_(pa.string()))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise Refused("a merge is not two tokens") from None
    if parts.null_count or ac.any_true(ac.not_equal(ac.list_value_length(parts), 2)):
        raise Refused("a merge is not two tokens")
    flat = ac.list_flatten(parts)
    left, right = (ac.take(flat, pa.array(np.arange(first, len(flat), 2))) for first in (0, 1))
    made = ac.binary_join_element_wise(left, right, "")
    rows = np.empty((len(merges), 3), np.int32)
    for k, col in enumerate((left, right, made)):
        at = ac.index_in(col, value_set=keys)
        if at.null_count:
            bad = int(np.flatnonzero(at.is_null().to_numpy(zero_copy_only=False))[0])
            raise Refused(f"the merge {left[bad].as_py()!r} {right[bad].as_py()!r} names or makes no token")
        rows[:, k] = ids[at.to_numpy()]
    return rows, made.to_pylist()


def _model(model: Any) -> tuple[dict[str, int], list[int], np.ndarray, np.ndarray | None]:
    """Return (one-character tokens -> ids, the 256 byte-fallback ids, the merges as (left, right, made) rows, the
    code point pairs inside the tokens they make: None where a merge takes or makes a byte-fallback token)."""
    import pyarrow as pa

    plain_bpe_checks(model)
    if not model.get("byte_fallback"):
        raise Refused("the BPE model has no byte fallback")
    if model.get("ignore_merges"):
        raise Refused("the BPE model has ignore_merges")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise Refused("the BPE vocabulary is not tokens -> ids")
    values = list(vocab.values())
    if not all(type(v) is int for v in values) or (values and not 0 <= min(values) <= max(values) < 2 ** 31):
        raise Refused("the BPE vocabulary is not tokens -> ids")
    byte_ids = [vocab.get(f"<0x{b:02X}>", -1) for b in range(256)]
    if min(byte_ids) < 0:
        raise Refused("the vocabulary lacks some of the 256 <0xHH> byte tokens")
    chars = {t: i for t, i in vocab.items() if len(t) == 1}
    merges, made_tokens = _merge_ids(model.get("merges") or [], pa.array(list(vocab), pa.string()),
                                     np.array(values, np.int32))
    from ..kernels.sp_bpe import bigrams_of

    # a merge that takes a byte-fallback token could join a character to bytes: then no cut is known
    fallback = np.isin(merges, np.array(byte_ids, np.int32)).any()
    return chars, byte_ids, merges, None if fallback else bigrams_of(made_tokens)


@dataclass(frozen=True)
class SpConversion:
    """What ``kernels.sp_bpe`` needs to give a SentencePiece-style tokenizer.json's ids, and the ids around them.

    ``compiled()`` is the table, made once on first use and kept here (None without the compiled kernel).
    """

    vocab: Any  # kernels.sp_bpe.SpVocab: the characters, byte-fallback ids, merges, space replacement and cuts
    special: dict[str, int]  # the added tokens' texts -> ids: a text holding one goes to tokenizers
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    after_added: int = 1  # where a text after an added token gets the replacement in front (sp_bpe's ALWAYS...)
    plain: frozenset[str] = frozenset()  # the added tokens that take no space beside them (no lstrip/rstrip)
    cached: bool = field(default=False, compare=False)  # read back from conversion_cache: the file was not parsed
    _table: list = field(default_factory=list, init=False, repr=False, compare=False)
    _bytes: list = field(default_factory=list, init=False, repr=False, compare=False)  # text_bytes(), once made
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def compiled(self) -> Any:
        """Return the compiled table (``kernels.sp_bpe.table``; None without the compiled kernel)."""
        with self._lock:
            if not self._table:
                from ..kernels import sp_bpe

                self._table.append(sp_bpe.table(self.vocab))
            return self._table[0]

    def segment_table(self) -> Any:
        """Return the compiled table of texts between added tokens (a chat's texts between its special tokens): the
        table itself, or one that prepends as ``after_added`` says (None without the compiled kernel)."""
        first = self.compiled()  # the list's first entry
        if self.after_added == self.vocab.prepend or first is None:
            return first
        with self._lock:
            if len(self._table) < 2:
                from ..kernels import sp_bpe

                self._table.append(sp_bpe.table(self.vocab._replace(prepend=self.after_added)))
            return self._table[1]

    def text_bytes(self) -> np.ndarray | None:
        """Return each id's length in bytes of the text it stands for (int64: the replacement one byte, a space's,
        a byte-fallback token one), for the ids the kernel gives; None where the replacement is no token (its
        bytes would be three ids for one byte of text); made once, read by every batch of chats."""
        with self._lock:
            if not self._bytes:
                self._bytes.append(self._text_bytes())
            return self._bytes[0]

    def _text_bytes(self) -> np.ndarray | None:
        """Return ``text_bytes()``, made from the vocabulary and the merges."""
        vocab = self.vocab
        if vocab.replacement not in vocab.chars:
            return None
        top = max(max(vocab.chars.values(), default=0), max(vocab.byte_ids), int(vocab.merges.max(initial=0)),
                  max(self.special.values(), default=0)) + 1
        out = np.zeros(top, np.int64)
        out[np.fromiter(vocab.chars.values(), np.int64, len(vocab.chars))] = [
            1 if c == vocab.replacement else len(c.encode("utf-8")) for c in vocab.chars]
        out[np.asarray(vocab.byte_ids, np.int64)] = 1
        for text, i in self.special.items():
            out[i] = len(text.encode("utf-8"))
        left, right, made = (vocab.merges[:, k].astype(np.int64) for k in range(3))
        # a merge's parts may be made by later merges: as many passes as a token has parts at most
        for _ in range(64):
            new = out[left] + out[right]
            if np.array_equal(out[made], new):
                return out
            out[made] = new
        return None


def _added(added: Any) -> tuple[dict[str, int], frozenset[str]]:
    """Return (the added tokens' texts -> ids, those that take no whitespace beside them), or refuse one matched
    after the normalizer."""
    out: dict[str, int] = {}
    plain = set()
    for a in added or []:
        content = a.get("content") or ""
        if not content:
            raise Refused("an added token is empty")
        if a.get("normalized"):
            raise Refused(f"the added token {content!r} is matched in the normalized text")
        out[content] = int(a["id"])
        if not (a.get("lstrip") or a.get("rstrip") or a.get("single_word")):
            plain.add(content)
    return out, frozenset(plain)


def _probe(conv: SpConversion, hf) -> None:
    """Refuse when the kernel and ``tokenizers`` differ on a probe text (a last check of the shapes above)."""
    from ..kernels import sp_bpe

    tab = conv.compiled()
    if tab is None:
        return
    texts = [t for t in _PROBES if not any(s in t for s in conv.special)]
    raw = [t.encode("utf-8") for t in texts]
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in raw]))).astype(np.int64)
    ids, counts = sp_bpe.encode(tab, (np.frombuffer(b"".join(raw) or b"\0", np.uint8), offsets))
    assert ids is not None
    mine = np.split(ids, np.cumsum(counts)[:-1])
    for text, got in zip(texts, mine):
        if got.tolist() != hf.encode(text, add_special_tokens=False).ids:
            raise Refused(f"the compiled BPE does not give the file's ids for {text!r}")


def sp_conversion(spec: dict, hf) -> SpConversion:
    """Return the compiled SentencePiece-style BPE's conversion of ``spec`` (``hf`` is it loaded), or raise
    ``Refused``."""
    replacement, prepend, after_added = _replacement(spec.get("normalizer"), spec.get("pre_tokenizer"))
    chars, byte_ids, merges, bigrams = _model(spec.get("model"))
    _post_processor(spec.get("post_processor"))
    if getattr(hf, "encode_special_tokens", False):
        raise Refused("the tokenizer encodes its special tokens as text")
    special, plain = _added(spec.get("added_tokens"))
    prefix, suffix = _around(hf)
    from ..kernels.sp_bpe import SpVocab

    conv = SpConversion(SpVocab(chars, byte_ids, merges, replacement, prepend, bigrams), special, prefix, suffix,
                        after_added, plain)
    _probe(conv, hf)
    return conv


def remember(path: str, conv: SpConversion) -> None:
    """Take ``conv`` (read back from ``conversion_cache``) as the decision on the file at ``path`` in this process."""
    with _MEMO_LOCK:
        _MEMO[file_key(path)] = conv


def converted(path: str, hf: Callable[[], Any], spec: dict | None = None) -> SpConversion | str:
    """Return the conversion of the tokenizer.json at ``path`` (``spec``: its JSON, already parsed), or why there is
    none; one decision per file and process."""
    key = file_key(path)
    with _MEMO_LOCK:
        if key not in _MEMO:
            spec = load_spec(path) if spec is None else spec
            try:
                _MEMO[key] = "the tokenizer file is not JSON" if spec is None else sp_conversion(spec, hf())
            except Refused as exc:
                _MEMO[key] = str(exc)
        return _MEMO[key]
