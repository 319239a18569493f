"""Token ids of text: tiktoken and the compiled BPE where they provably give a tokenizer.json's ids, else tokenizers.

A byte-level BPE ``tokenizer.json`` (GPT-2, Llama 3, Qwen, Mistral-Nemo styles) can be run by
tiktoken, several times faster per core, with its ids unchanged, when the conversion is exact:
``bpe_conversion.exact_conversion`` decides that from the file (the proof is its docstring), and
``TokenEncoder`` uses tiktoken only then. With GPT-2's, Llama 3's or Qwen 2's pattern, every text goes
through ``kernels.bpe`` instead (no regex engine: the pattern's pieces are found by hand over UTF-8,
each merged as tiktoken merges it), read from the Arrow buffers (``token_columns.encode_column``);
texts holding an added token's text, and any text where the compiled kernel is not built, through
tiktoken. Either way the ids are the same, so plans do not record which encoder ran in anything that
``content_hash`` covers; the manifest's ``provenance.tokenizers`` says which did and why.
"""
from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..env import env_text
from ..errors import SortpackError, one_line
from .bpe_conversion import Conversion, Refused, exact_conversion, file_key, parse_spec
from .token_columns import encode_column, hf_ids, surround, token_ids

__all__ = ["LazyTokenizer", "TokenEncoder", "encoder_provenance", "hf_ids", "parse_tokenizer_file", "token_ids"]

_OFF = "SORTPACK_FAST_TOKENIZER"  # "0": always Hugging Face tokenizers; "tiktoken": tiktoken for every text
_MEMO: dict[tuple, Any] = {}  # (path, mtime, size) -> its _Exact or the reason: one decision per process
_MEMO_LOCK = threading.Lock()
_REFUSED_SPEC: list = []  # [path, its JSON, its cache key] of the file tiktoken's decision refused last (_MEMO_LOCK)
NEEDS_TOKENIZERS = "--tokenizer needs the tokenizers package (pip install 'sortpack[tokenizers]')"


class _Exact:
    """A proven conversion of one tokenizer file, and tiktoken's Encoding of it, made on first use (shared by the
    file's encoders in this process: building it takes 0.04 s for a 128k vocabulary, which texts the compiled
    kernel encodes never need)."""

    def __init__(self, name: str, conv: Conversion, cached: bool):
        self.name, self.conv, self.cached = name, conv, cached
        self._encoding: Any = None
        self._lock = threading.Lock()

    @property
    def encoding(self) -> Any:
        """Return tiktoken's Encoding of the conversion (built once)."""
        if self._encoding is None:
            with self._lock:
                if self._encoding is None:
                    import tiktoken

                    conv = self.conv
                    self._encoding = tiktoken.Encoding(self.name, pat_str=conv.pattern, mergeable_ranks=conv.ranks,
                                                       special_tokens=conv.special)
        return self._encoding


def _converted(path: str, hf: Callable[[], Any]) -> _Exact | str:
    """Return the proven conversion of the tokenizer.json at ``path``, or why there is none; ``hf()`` gives the
    file's Hugging Face Tokenizer where the proof needs it."""
    key = file_key(path)
    with _MEMO_LOCK:
        if key not in _MEMO:
            _MEMO[key] = _convert(path, hf)
        return _MEMO[key]


def _convert(path: str, hf: Callable[[], Any]) -> _Exact | str:
    """Return the conversion (kept on disk once proven: ``conversion_cache``), or why none."""
    from . import conversion_cache

    try:
        with open(path, "rb") as f:
            raw = f.read()  # read once: its digest keys the cache, its JSON is the spec to prove
    except OSError:
        return "the tokenizer file is not JSON"
    key = conversion_cache.entry_key(raw)
    conv = conversion_cache.load(key)
    cached = conv is not None
    if conv is None:
        sp = conversion_cache.load_sp(key)
        if sp is not None:  # a SentencePiece-style file converted before: tiktoken's refusal with it
            from .sp_conversion import remember

            remember(path, sp[0])
            return sp[1]
        spec = parse_spec(raw)
        if spec is None:
            return "the tokenizer file is not JSON"
        try:
            conv = exact_conversion(spec, hf())
        except Refused as exc:
            # the SentencePiece-style decision next reads the JSON (no second parse) and keeps its own under the key
            _REFUSED_SPEC[:] = [path, spec, key]
            return str(exc)
        conversion_cache.store(key, conv)
    return _Exact(os.path.basename(path), conv, cached)


def parse_tokenizer_file(path: str) -> Any:
    """Return the Hugging Face ``Tokenizer`` of a tokenizer.json, truncation and padding off (a bad file: one line)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SortpackError(NEEDS_TOKENIZERS) from None
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own exception type
        raise SortpackError(f"--tokenizer {path}: cannot load ({one_line(exc)})") from None
    # a model's tokenizer.json often truncates and pads to a fixed length, which would make every sample measure
    # the same
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


class LazyTokenizer:
    """A tokenizer file's Hugging Face ``Tokenizer``, parsed on first use (by any thread) and standing in for it: its
    attributes are the Tokenizer's. Parsing a 128k vocabulary takes 0.15-0.2 s a rank, and a job whose file's
    conversion the cache holds proven never needs it where the compiled path encodes every text.

    Pickled, it sends the parsed Tokenizer (a collate's ``tokenize=`` goes to DataLoader workers).
    """

    def __init__(self, path: str, value: Any = None):
        self.path, self.value = path, value
        self._lock = threading.Lock()

    @property
    def parsed(self) -> bool:
        """Return whether the Tokenizer is parsed already."""
        return self.value is not None

    def get(self) -> Any:
        """Return the parsed Tokenizer."""
        if self.value is None:
            with self._lock:
                if self.value is None:
                    self.value = parse_tokenizer_file(self.path)
        return self.value

    def __getattr__(self, name: str):
        if name.startswith("_") or name in ("path", "value", "hf", "handle"):
            raise AttributeError(name)  # not set yet (unpickling), or what no Tokenizer has: never a parse
        return getattr(self.get(), name)

    def __getstate__(self) -> dict:
        return {"path": self.path, "value": self.get()}

    def __setstate__(self, state: dict) -> None:
        self.path, self.value = state["path"], state["value"]
        self._lock = threading.Lock()


@functools.cache
def _tiktoken_version() -> str | None:
    """Return the installed tiktoken's version ("unknown" where no one wheel's folder names it; None: not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("tiktoken")
    if spec is None or not spec.origin:
        return None
    # its wheel's .dist-info folder beside it names the version, as importlib.metadata reads it: loading that module
    # and scanning every distribution on sys.path cost a rank about 15 ms of CPU each job
    found = [n[9:-10] for n in os.listdir(os.path.dirname(os.path.dirname(spec.origin)))
             if n.startswith("tiktoken-") and n.endswith(".dist-info")]
    return found[0] if len(found) == 1 else "unknown"


def _compiled(conv: Conversion) -> tuple[Any, str | None]:
    """Return ((the compiled table, the style) or None, why texts beyond ASCII are not compiled (None: they are))."""
    from ..kernels import bpe

    style = conv.style
    if style not in bpe.STYLES or env_text(_OFF) == "tiktoken":
        return None, None
    tab = conv.compiled()
    if tab is None:
        return None, None
    if tab.unicode:
        return (tab, style), None
    from ..kernels.unicode_classes import same_as_tokenizers

    return (tab, style), same_as_tokenizers() or "the code point classes are not loaded"


_CHOSEN: dict[str, dict] = {}  # tokenizer file name -> the record of the latest TokenEncoder of it in this process
RENDERED: dict[str, dict] = {}  # chat template file name -> how this process rendered its chats (finetune.fast_chats)


def encoder_provenance(options: dict) -> dict:
    """Return ``{"tokenizers": {file name: record}}`` for the tokenizer ``options`` name, if one was loaded here.

    The ids are the same whichever encoder ran, so the choice belongs in the provenance, out of
    ``content_hash``: a plan's data files and hash are identical with or without tiktoken.
    """
    name = options.get("tokenizer")
    record = _CHOSEN.get(name) if isinstance(name, str) else None
    out = {"tokenizers": {name: record}} if record is not None else {}
    fine = options.get("fine_tune")
    template = fine.get("chat_template") if isinstance(fine, dict) else None
    if isinstance(template, str) and template in RENDERED:
        out["chat_render"] = {template: RENDERED[template]}
    return out


def _threads() -> int:
    """Return the threads a rank encodes with: ``RAYON_NUM_THREADS`` (the CLI sets cores / ranks), else the cores."""
    from ..env import env_int

    try:
        return max(env_int("RAYON_NUM_THREADS") or os.cpu_count() or 1, 1)
    except ValueError:
        return 1


class TokenEncoder:
    """A loaded tokenizer.json that encodes text columns: tiktoken where exact, else Hugging Face ``tokenizers``.

    Every other attribute is the Hugging Face ``Tokenizer``'s (``encode``, ``token_to_id``, ...),
    so code written for one takes the other. ``engine`` is ``"tiktoken"`` or ``"tokenizers"``;
    ``reason`` why tiktoken is not used (None when it is); ``compiled`` the ``kernels.bpe`` table and
    style that encode text columns (None: none), ``unicode`` why it takes ASCII texts only (None: all).
    """

    def __init__(self, hf, path: str):
        # hf: the file's Hugging Face Tokenizer, a LazyTokenizer of it (shared: load_tokenizer keeps one a file), or
        # None. Unparsed, it is parsed where this encoder needs it: where the proof runs, where tiktoken is not
        # used (here: a file that cannot be loaded fails now, as one line, before any work), and for what
        # tiktoken does not do
        self.handle = hf if isinstance(hf, LazyTokenizer) else LazyTokenizer(path, hf)
        self.path = path
        self.engine, self.reason, self.unicode = "tokenizers", None, None
        self._exact: _Exact | None = None
        self._pool: Any = None  # threads for encode_texts and encode_column (made on first use)
        self._pool_pid = 0  # the process that made them (a fork child makes its own)
        self._pool_lock = threading.Lock()
        self.allowed: frozenset[str] = frozenset()  # the added tokens' texts, which tiktoken splits first
        self.prefix: tuple[int, ...] = ()
        self.suffix: tuple[int, ...] = ()
        self.compiled: Any = None
        self._lengths: np.ndarray | None = None
        self._sp: Any = None  # the SentencePiece-style conversion where kernels.sp_bpe encodes (engine "compiled")
        self.sp_reason: str | None = None  # why it does not, where tiktoken does not either
        if env_text(_OFF) == "0":
            self.reason = f"{_OFF}=0"
        else:
            got = _converted(path, self.handle.get) if _tiktoken_version() is not None else \
                "tiktoken is not installed (pip install 'sortpack[fasttok]')"
            if isinstance(got, str):
                self.reason = got
                self._take_sentencepiece(path)  # needs no tiktoken
            else:
                self._exact, conv = got, got.conv
                self.allowed, self.prefix, self.suffix = frozenset(conv.special), conv.prefix, conv.suffix
                self.engine = "tiktoken"
                self.compiled, self.unicode = _compiled(conv)
        if not (self._exact.cached if self._exact is not None else self._sp is not None and self._sp.cached):
            self.handle.get()
        _CHOSEN[os.path.basename(path)] = self.record()

    def _take_sentencepiece(self, path: str) -> None:
        """Encode through ``kernels.sp_bpe`` where it gives the file's ids (``sp_conversion``): a SentencePiece-style
        file, which tiktoken cannot run."""
        from .sp_conversion import converted

        with _MEMO_LOCK:  # the JSON the tiktoken decision parsed, if it refused this file just now
            spec, key = _REFUSED_SPEC[1:] if _REFUSED_SPEC and _REFUSED_SPEC[0] == path else (None, None)
            _REFUSED_SPEC.clear()
        got = converted(path, self.handle.get, spec)
        if isinstance(got, str):
            self.sp_reason = got
            return
        if key is not None and not got.cached:
            from . import conversion_cache

            conversion_cache.store_sp(key, got, self.reason or "")
        tab = got.compiled()
        if tab is None:
            from ..kernels import sp_bpe

            self.sp_reason = f"the compiled kernel is unavailable ({sp_bpe.unavailable})"
            return
        from ..kernels.sp_bpe import STYLE

        self._sp = got
        self.engine, self.compiled = "compiled", (tab, STYLE)
        self.allowed, self.prefix, self.suffix = frozenset(got.special), got.prefix, got.suffix

    @property
    def sentencepiece(self) -> Any:
        """Return the SentencePiece-style conversion ``kernels.sp_bpe`` encodes with (``sp_conversion.SpConversion``;
        None: this encoder does not use it)."""
        return self._sp

    @property
    def hf(self) -> Any:
        """Return the file's Hugging Face ``Tokenizer`` (parsed on first use)."""
        return self.handle.get()

    def token_to_id(self, token: str) -> int | None:
        """Return the id of ``token`` (an added token's from the conversion, without parsing the file), as the
        Tokenizer's ``token_to_id``."""
        special = self._conv.special if self._conv is not None else self._sp.special if self._sp is not None else {}
        if token in special:
            return special[token]
        return self.hf.token_to_id(token)

    @property
    def _conv(self) -> Conversion | None:
        """Return the file's proven conversion (None: tiktoken is not exact for it)."""
        return None if self._exact is None else self._exact.conv

    @property
    def _fast(self) -> Any:
        """Return tiktoken's Encoding of the file (None: tiktoken is not exact for it)."""
        return None if self._exact is None else self._exact.encoding

    def __getattr__(self, name: str):
        if name in ("hf", "handle") or name.startswith("_"):
            # not yet set (unpickling, copying): never look it up through itself
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __reduce__(self):
        """Return how to rebuild this encoder in another process (its thread pool is not sent; an unparsed
        Hugging Face Tokenizer is parsed there when used)."""
        return TokenEncoder, (self.handle, self.path)

    def record(self) -> dict:
        """Return what the manifest's provenance says of this encoder."""
        out: dict[str, Any] = {"encoder": self.engine}
        if self.engine == "tiktoken":
            out["tiktoken"] = _tiktoken_version()
            if self.compiled is not None:  # texts through kernels.bpe, the same ids
                out["compiled"] = "ascii" if self.unicode else "utf-8"
                if self.unicode:
                    out["why_ascii"] = self.unicode
        elif self.engine == "compiled":  # a SentencePiece-style file through kernels.sp_bpe, the same ids
            out["bpe"] = "sentencepiece"
            out["why_not_tiktoken"] = self.reason
        else:
            import tokenizers

            out["tokenizers"] = tokenizers.__version__
            out["why"] = self.reason
            if self.sp_reason is not None:
                out["why_not_compiled"] = self.sp_reason
        return out

    def token_lengths(self) -> np.ndarray | None:
        """Return every id's length in bytes (int64; its text's for an added token), None unless tiktoken is exact:
        a text's ids then spell its bytes, so a token's byte offsets are the running sum of these."""
        conv = self._conv
        if conv is None:
            return None
        if self._lengths is None:
            top = max(max(conv.ranks.values(), default=-1), max(conv.special.values(), default=-1)) + 1
            out = np.zeros(top, np.int64)
            out[np.fromiter(conv.ranks.values(), np.int64, len(conv.ranks))] = np.fromiter(
                map(len, conv.ranks), np.int64, len(conv.ranks))
            for text, i in conv.special.items():
                out[i] = len(text.encode("utf-8"))
            self._lengths = out
        return self._lengths

    def threads(self) -> int:
        """Return the threads this encoder works with (``RAYON_NUM_THREADS``, else the cores)."""
        return _threads()

    def map_threads(self, fn, items: list) -> list:
        """Return ``[fn(x) for x in items]``, computed in this encoder's threads when there are several items."""
        if len(items) < 2:
            return [fn(x) for x in items]
        with self._pool_lock:
            # a fork child (a DataLoader's worker) inherits the pool without its threads: its runs would wait for ever
            if self._pool is None or self._pool_pid != os.getpid():
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.threads(), thread_name_prefix="sortpack-tokens")
                self._pool_pid = os.getpid()
        return list(self._pool.map(fn, items))

    def encode_texts(self, texts: list[str], special_tokens: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Return (every text's ids in order as one int32 array, each text's count as int64): ``encode``'s ids."""
        if self._sp is not None:
            got = self._sp_texts(texts, special_tokens)
            if got is not None:
                return got
        if self._exact is None:  # tokenizers: and what the compiled path cannot take, for its own error
            return hf_ids(self.hf, texts, special_tokens)
        threads = self.threads()
        if threads > 1 and len(texts) >= 2 * threads:
            # tiktoken lets go of the GIL while it encodes: contiguous runs of about equal characters
            ends = np.searchsorted(np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts))),
                                   np.arange(1, threads) * (sum(map(len, texts)) / threads))
            runs = [texts[a:b] for a, b in zip([0, *ends.tolist()], [*ends.tolist(), len(texts)])]
            done = self.map_threads(self._encode_run, runs)
            ids = np.concatenate([d[0] for d in done])
            counts = np.concatenate([d[1] for d in done])
        else:
            ids, counts = self._encode_run(texts)
        if special_tokens and (self.prefix or self.suffix):
            ids, counts = surround(ids, counts, self.prefix, self.suffix)
        return ids, counts

    def _sp_texts(self, texts: list[str], special_tokens: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """Return ``encode_texts``' ids through ``kernels.sp_bpe``; None where ``texts`` are not all strings Arrow can
        hold (None, bytes, a lone surrogate): tokenizers' own error then, as without the compiled path."""
        import pyarrow as pa

        if not all(isinstance(t, str) for t in texts):
            return None
        try:
            col = pa.array(texts, pa.large_string())
        except (UnicodeError, pa.ArrowException):
            return None
        got = encode_column(self, col, special_tokens, True)
        return None if got is None or got[0] is None else (got[0], got[1])

    def encode_others(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Return (ids, counts) without the post-processor's tokens of texts the compiled path leaves out (holding an
        added token's text): tiktoken's where it is exact, else ``tokenizers``'."""
        if self._exact is None:
            return hf_ids(self.hf, texts, False)
        return self.encode_texts(texts, special_tokens=False)

    def encode_column(self, col: Any, special_tokens: bool = True, keep: bool = True
                      ) -> tuple[np.ndarray | None, np.ndarray] | None:
        """Return (the ids of a string array's texts as one int32 array, None when not ``keep``; their counts)
        through the compiled path (``token_columns.encode_column``); None where it does not apply."""
        return encode_column(self, col, special_tokens, keep)

    def _encode_run(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Return (the ids as one int32 array, the counts) of texts encoded one after another in this thread."""
        if not self.allowed:
            # no added tokens: tiktoken's special-token search would look for an empty pattern at every
            # position (1.6x the time); its plain encode gives the same ids as lists
            lists = list(map(self._fast.encode_ordinary, texts))
            counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
            return np.fromiter(itertools.chain.from_iterable(lists), np.int32, int(counts.sum())), counts
        encode, allowed = self._fast.encode_to_numpy, self.allowed
        parts = [encode(t, allowed_special=allowed, disallowed_special=()) for t in texts]
        counts = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        return (np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)), counts
