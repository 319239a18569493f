"""Mistral's own chat templates, byte-exact, found in a registry package: the tests' and the benchmark's source.

No package that installs from PyPI ships Mistral 7B's or Mixtral's ``chat_template`` as a file
(TRL has none). llama-cpp-python's source distribution holds all four as string literals: v0.1's
and Mixtral's at release in ``llama_cpp/llama_chat_format.py``, v0.2's and v0.3's current ones in
its vendored llama.cpp ``tests/test-chat-template.cpp``. ``unpack_templates`` reads every string
literal of those two files and writes the ones whose sha256 is a Mistral family's
(``sortpack.inputs.finetune.families.FAMILIES``) as ``<family>.jinja``; ``.ci/run`` does it into
``CHAT_TEMPLATES_DATA`` (``python -m benchmarks.real_templates SDIST FOLDER``).
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
import sys
import tarfile
from pathlib import Path

# the family (its name in families.FAMILIES) -> its template's sha256
MISTRAL = {
    "mistral_v0_1": "7e995b379ec01747807246483647cd99030abf331653f1119e16d7ac041a3495",
    "mixtral": "26a59556925c987317ce5291811ba3b7f32ec4c647c400c6cc7e3a9993007ba7",
    "mistral_v0_2": "796853172235ab3aaa4810013ddfe2eab481bda3306dad4f700c00d436eed596",
    "mistral_v0_3": "e16746b40344d6c5b5265988e0328a0bf7277be86f1c335156eae07e29c82826",
}
_SOURCES = ("llama_cpp/llama_chat_format.py", "vendor/llama.cpp/tests/test-chat-template.cpp")
# a double-quoted literal on one line (Python's and C's escapes that these files use are the same)
_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def literals(text: str) -> list[str]:
    """Return every double-quoted one-line string literal of a Python or C++ source, unescaped."""
    out = []
    for m in _LITERAL.finditer(text):
        try:
            value = ast.literal_eval(m.group(0))
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str):
            out.append(value)
    return out


def unpack_templates(sdist: Path, folder: Path) -> list[str]:
    """Write the Mistral templates found in llama-cpp-python's source distribution ``sdist`` into ``folder``; return
    the families written."""
    by_digest = {d: name for name, d in MISTRAL.items()}
    folder.mkdir(parents=True, exist_ok=True)
    found = []
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.isfile() or member.name.split("/", 1)[-1] not in _SOURCES:
                continue
            got = tar.extractfile(member)
            assert got is not None
            for value in literals(got.read().decode("utf-8")):
                name = by_digest.get(hashlib.sha256(value.encode("utf-8")).hexdigest())
                if name is not None and name not in found:
                    (folder / f"{name}.jinja").write_text(value, encoding="utf-8")
                    found.append(name)
    return found


def mistral_templates() -> dict[str, str] | None:
    """Return family -> its template's text from ``CHAT_TEMPLATES_DATA`` (None: the folder or a template is missing,
    or a file is not the template its name says)."""
    given = os.environ.get("CHAT_TEMPLATES_DATA")
    if not given:
        return None
    out = {}
    for name, digest in MISTRAL.items():
        path = Path(given) / f"{name}.jinja"
        if not path.is_file():
            return None
        text = path.read_text(encoding="utf-8")
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != digest:
            return None
        out[name] = text
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m benchmarks.real_templates LLAMA_CPP_PYTHON_SDIST FOLDER")
    names = unpack_templates(Path(sys.argv[1]), Path(sys.argv[2]))
    missing = sorted(set(MISTRAL) - set(names))
    if missing:
        sys.exit(f"{sys.argv[1]}: no template of {', '.join(missing)} in it")
    print(f"wrote {', '.join(names)} into {sys.argv[2]}")
