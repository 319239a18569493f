"""CONTRIBUTING.md's package map is the tree's: every package and module, each package's and base module's first
docstring sentence. ``python tests/docs/test_package_map.py --write`` writes it after a module moves."""
from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "sortpack"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
BEGIN = "<!-- package map: `python tests/docs/test_package_map.py --write` writes it from the tree -->"
END = "<!-- end of the package map -->"
NAME_WIDTH = 18  # the column the descriptions start at


def first_sentence(path: Path) -> str:
    """Return the first sentence of a module's docstring (its first paragraph up to a full stop), one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?\.)(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def package_map() -> str:
    """Return the map: each package with its first sentence and its modules, then the base modules with theirs."""
    lines = ["```", "sortpack/"]
    packages = sorted(p.parent for p in PKG.rglob("__init__.py"))
    for package in packages[1:]:
        name = package.relative_to(PKG).as_posix() + "/"
        lines.append(f"  {name:<{NAME_WIDTH}}{first_sentence(package / '__init__.py')}")
        modules = ", ".join(sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__"))
        lines += textwrap.wrap(modules, 118, initial_indent=" " * (NAME_WIDTH + 2),
                               subsequent_indent=" " * (NAME_WIDTH + 2))
    for module in sorted(PKG.glob("*.py")):
        if module.stem not in ("__init__", "__main__"):
            lines.append(f"  {module.name:<{NAME_WIDTH}}{first_sentence(module)}")
    return "\n".join([*lines, "```"])


def written_map() -> str:
    """Return the map CONTRIBUTING.md holds between its markers."""
    text = CONTRIBUTING.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()


def test_the_package_map_is_the_tree():
    assert written_map() == package_map(), ("CONTRIBUTING.md's package map is not the tree's: run "
                                            "`python tests/docs/test_package_map.py --write`")


def test_every_package_and_module_says_what_it_is():
    # the map is only as good as the first sentences it is made of
    silent = [p.relative_to(ROOT).as_posix() for p in PKG.rglob("*.py")
              if p.name != "__main__.py" and not first_sentence(p)]
    assert not silent, f"modules without a docstring: {silent}"


ARCHITECTURE = ROOT / "docs" / "architecture.md"
# groups whose modules the architecture names as a kind ("one file per command", "one file per kernel")
NAMED_AS_A_KIND = ("cli", "kernels")


def test_the_architecture_names_every_module_group_and_module():
    text = ARCHITECTURE.read_text()
    groups = [p.parent.relative_to(PKG).as_posix() + "/" for p in PKG.rglob("__init__.py") if p.parent != PKG]
    missing = [g for g in groups if g not in text and f"`{g.rsplit('/', 2)[-2]}/`" not in text]
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if path.stem in ("__init__", "__main__") or rel.parts[0] in NAMED_AS_A_KIND:
            continue
        dotted = "sortpack." + ".".join(rel.with_suffix("").parts)
        named = (f"`{path.stem}`", f"`{path.stem} ", f"`{path.name}`", rel.as_posix(), f"`{dotted}`")
        if not any(name in text for name in named):
            missing.append(rel.as_posix())
    assert not missing, f"docs/architecture.md does not name {sorted(missing)}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        text = CONTRIBUTING.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        CONTRIBUTING.write_text(f"{text[:start]}\n{package_map()}\n{text[end:]}")
    else:
        print(package_map())
