"""The code point classes the tokenizer patterns' regexes use (``\\p{L}``, ``\\p{N}``, ``\\s``), for ``kernels.bpe``.

The classes come from the regex engines themselves, not from Python's ``unicodedata``: Hugging Face
``tokenizers`` (Oniguruma) and tiktoken (fancy-regex over Rust's ``regex``) are the two whose
pieces the compiled BPE must reproduce, and their Unicode tables are newer than Python's (Unicode
16.0 in ``tokenizers`` 0.23 and tiktoken 0.14, Unicode 14.0 in Python 3.11's ``unicodedata``:
9,272 letters and 120 numbers apart). ``python -m sortpack.kernels.unicode_classes`` probes every
code point through ``tokenizers``' engine (the file's ids are what the compiled path must give: where
the engines differ, ``tokenizers`` wins), checks tiktoken's engine against it, and rewrites
``_unicode_ranges.py``; the tests compare the committed ranges with both engines again.

``same_as_tokenizers()`` says whether the installed ``tokenizers`` has the classes of the ranges:
a version other than the one recorded is probed at the ranges' edges and on a grid of code points.
"""
from __future__ import annotations

import sys
from functools import lru_cache

import numpy as np

OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3  # the kernel's classes (enum in _bpe.c)
CODE_POINTS = 0x110000
_CLASSES = {LETTER: r"\p{L}", NUMBER: r"\p{N}", SPACE: r"\s"}
# a letter first assigned in each Unicode version: the newest the engine calls a letter names its tables' version
_SENTINELS = {"13.0": 0x10E80, "14.0": 0x1E290, "15.0": 0x31350, "15.1": 0x2EBF0, "16.0": 0x1C89, "17.0": 0x323B0}


def points() -> list[int]:
    """Return every code point but the surrogates (which no Python string encodes to UTF-8)."""
    return [c for c in range(CODE_POINTS) if not 0xD800 <= c <= 0xDFFF]


def tokenizers_classes(cps: list[int]) -> np.ndarray:
    """Return the class of each code point in ``cps`` as Hugging Face ``tokenizers``' regex engine matches it."""
    from tokenizers import Regex, pre_tokenizers

    out = np.zeros(len(cps), np.uint8)
    for cls, regex in _CLASSES.items():
        sep = "a" if cls == SPACE else "\x00"  # one code point that is not of the class between the probed ones
        split = pre_tokenizers.Split(Regex(regex), "isolated")
        for a in range(0, len(cps), 8192):
            block = cps[a:a + 8192]
            hits = {p for p, _ in split.pre_tokenize_str(sep.join(map(chr, block))) if len(p) == 1 and p != sep}
            out[a:a + len(block)][np.fromiter((chr(c) in hits for c in block), bool, len(block))] = cls
    return out


def tiktoken_classes(cps: list[int]) -> np.ndarray:
    """Return the class of each code point in ``cps`` as tiktoken's regex engine matches it."""
    import tiktoken

    out = np.zeros(len(cps), np.uint8)
    for cls, regex in _CLASSES.items():
        for a in range(0, len(cps), 4096):
            block = cps[a:a + 4096]
            ranks = {bytes([b]): b for b in range(256)}
            for c in block:  # each code point one token: tiktoken keeps only the matches, one token each
                ranks.setdefault(chr(c).encode("utf-8"), len(ranks))
            enc = tiktoken.Encoding("classes", pat_str=regex, mergeable_ranks=ranks, special_tokens={})
            where = {c: k for k, c in enumerate(block)}
            for tok in enc.encode_ordinary("".join(map(chr, block))):
                text = enc.decode_single_token_bytes(tok).decode("utf-8", errors="replace")
                if len(text) == 1 and ord(text) in where:
                    out[a + where[ord(text)]] = cls
    return out


def unicode_version(classes_of) -> str:
    """Return the newest Unicode version whose sentinel letter ``classes_of`` calls a letter."""
    got = classes_of(list(_SENTINELS.values()))
    return max((v for v, c in zip(_SENTINELS, got) if c == LETTER), key=lambda v: tuple(map(int, v.split("."))),
               default="older than 13.0")


def ranges(classes: np.ndarray, cps) -> dict[int, list[tuple[int, int]]]:
    """Return, per class but OTHER, its code points as inclusive (first, last) ranges."""
    full = np.zeros(CODE_POINTS, np.uint8)
    full[np.asarray(cps)] = classes
    edges = np.flatnonzero(np.diff(full.astype(np.int16), prepend=-1, append=-1))
    out: dict[int, list[tuple[int, int]]] = {cls: [] for cls in _CLASSES}
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        if full[a] != OTHER:
            out[int(full[a])].append((a, b - 1))
    return out


@lru_cache(maxsize=1)
def class_table() -> np.ndarray:
    """Return the class of every code point (uint8, ``CODE_POINTS`` long) from the committed ranges."""
    from . import _unicode_ranges as R

    table = np.zeros(CODE_POINTS, np.uint8)
    for cls, flat in ((LETTER, R.LETTERS), (NUMBER, R.NUMBERS), (SPACE, R.SPACES)):
        for a, b in zip(flat[::2], flat[1::2]):
            table[a:b + 1] = cls
    table.flags.writeable = False
    return table


def _probe_points() -> list[int]:
    """Return the code points a ``tokenizers`` of another version is checked on: each range's edges and a grid."""
    from . import _unicode_ranges as R

    edges = {c + d for flat in (R.LETTERS, R.NUMBERS, R.SPACES) for c in flat for d in (-1, 0, 1)}
    grid = set(range(0, CODE_POINTS, 97))
    return sorted(c for c in edges | grid if 0 <= c < CODE_POINTS and not 0xD800 <= c <= 0xDFFF)


@lru_cache(maxsize=1)
def same_as_tokenizers() -> str | None:
    """Return None when the installed ``tokenizers`` has the committed classes, else why not (one probe per process)."""
    from importlib.metadata import version

    from . import _unicode_ranges as R

    try:
        installed = version("tokenizers")
    except Exception:  # noqa: BLE001 - not installed, or metadata unreadable
        return "tokenizers is not installed"
    if installed == R.ENGINES["tokenizers"]:
        return None
    cps = _probe_points()
    got = tokenizers_classes(cps)
    differ = np.flatnonzero(got != class_table()[np.asarray(cps)])
    if len(differ):
        return (f"tokenizers {installed} classes U+{cps[int(differ[0])]:04X} otherwise than the Unicode "
                f"{R.UNICODE} tables generated with tokenizers {R.ENGINES['tokenizers']}")
    return None


def _lines(flat: list[int]) -> str:
    """Return ``flat`` as the body of a tuple literal, five ranges a line."""
    rows = [", ".join(f"0x{c:X}" for c in flat[k:k + 10]) for k in range(0, len(flat), 10)]
    return "".join(f"    {row},\n" for row in rows)


def generate() -> str:
    """Return the text of ``_unicode_ranges.py`` from the installed engines (tiktoken's must agree)."""
    import unicodedata
    from importlib.metadata import version

    cps = points()
    hf = tokenizers_classes(cps)
    tk = tiktoken_classes(cps)
    apart = np.flatnonzero(hf != tk)
    if len(apart):
        print(f"tiktoken's engine classes {len(apart)} code points otherwise (first U+{cps[int(apart[0])]:04X}); "
              "the ranges follow tokenizers", file=sys.stderr)
    got = ranges(hf, cps)
    flat = {cls: [c for r in got[cls] for c in r] for cls in _CLASSES}
    body = "\n".join(f"{name} = (\n{_lines(flat[cls])})\n"
                     for name, cls in (("LETTERS", LETTER), ("NUMBERS", NUMBER), ("SPACES", SPACE)))
    return (f'"""Generated by ``python -m sortpack.kernels.unicode_classes``: do not edit.\n\nThe code points '
            'that Hugging Face tokenizers\' regex engine matches with \\\\p{L}, \\\\p{N} and \\\\s, as inclusive\n'
            '(first, last) pairs; tiktoken\'s engine agreed on '
            f'{"every code point" if not len(apart) else f"all but {len(apart)} code points"}.\n"""\n'
            f'UNICODE = "{unicode_version(tokenizers_classes)}"  # the tables\' version, from the letters each added\n'
            f'ENGINES = {{"tokenizers": "{version("tokenizers")}", "tiktoken": "{version("tiktoken")}"}}\n'
            f'PYTHON_UNICODE = "{unicodedata.unidata_version}"  # this Python\'s unicodedata, not used\n\n{body}')


def main() -> int:
    """Rewrite ``_unicode_ranges.py`` beside this module from the installed engines."""
    from pathlib import Path

    target = Path(__file__).with_name("_unicode_ranges.py")
    target.write_text(generate(), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
