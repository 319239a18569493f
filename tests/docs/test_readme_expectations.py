"""The README's expectations stay true: the quick-suite command, what --max-tokens counts in the first
command, the CPU torch install, and the extra each documented command needs."""
from __future__ import annotations

import ast
import re
import sys

import pyarrow as pa
import pytest

from support import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
CPU_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"


def section(title: str) -> str:
    """Return the README's text from heading ``title`` to the next heading of any level."""
    start = README.index(f"\n{title}\n")
    following = re.search(r"^#{1,6} ", README[start + len(title) + 2:], flags=re.MULTILINE)
    return README[start:start + len(title) + 2 + (following.start() if following else len(README))]


def requirement_names(extra: str) -> set[str]:
    """Return the distribution names an extra of pyproject.toml requires."""
    return {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() for req in EXTRAS[extra]}


def test_the_quick_command_names_a_marker_that_exists_and_is_used():
    expect = section("### What to expect")
    assert 'python -m pytest -m "not slow"' in expect
    markers = {m.split(":")[0].strip() for m in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]}
    assert "slow" in markers
    marked = [p for p in (ROOT / "tests").rglob("test_*.py") if "mark.slow" in p.read_text()]
    assert len(marked) >= 3, marked  # the quick part leaves something out


def test_the_first_command_budgets_characters_under_the_default_size():
    from sortpack.cli.group import cli
    from sortpack.inputs.specs import evaluate, parse_spec

    first = re.search(r"```bash\n(.*?)```", section("## Two commands on a fresh machine"), flags=re.DOTALL).group(1)
    run = first[first.index("sortpack run"):]
    assert "--max-tokens" in run and "--size" not in run.split("&&")[0]  # the default size applies
    default = next(p.default for p in cli.get_command(None, "run").params if p.name == "size_spec")
    assert default == "length"
    # "length" counts characters, not bytes or tokens: the paragraph under the command says so
    assert evaluate(parse_spec(default, "text", "--size"), pa.table({"text": ["été x"]}), "t").tolist() == [5]
    two = " ".join(section("## Two commands on a fresh machine").split())
    assert "counts **characters**" in two and "--size tokens --tokenizer tokenizer.json" in two
    assert "`tokenizers`" in two and '".[mpich,tokenizers]"' in two


def test_torch_is_one_pinned_version_and_its_cpu_build_is_documented():
    two = section("## Two commands on a fresh machine")
    assert CPU_TORCH in two and "CUDA build" in two  # how to get the CPU build where pip would not
    training = (ROOT / "docs" / "training.md").read_text()
    for where, text in (("README.md", README), ("docs/training.md", training),
                        ("pyproject.toml", (ROOT / "pyproject.toml").read_text()),
                        (".ci/run", (ROOT / ".ci" / "run").read_text())):
        pins = re.findall(r"torch==([\d.]+)", text)
        assert pins and set(pins) == {"2.13.0"}, (where, pins)
    # CI runs the README's test command: the pin in the same pip command as the test extras
    command = 'pip install -e ".[mpich,test]" torch==2.13.0'
    assert command in two and command in (ROOT / ".ci" / "run").read_text()
    torch = pytest.importorskip("torch")
    assert torch.__version__.split("+")[0] == "2.13.0"  # the pin is the version the suite runs


def extras_table() -> dict[str, str]:
    """Return the README's "Extras per command" table: command text -> the extra's name."""
    rows = re.findall(r"^\| (.+?) \| `(\w+)`[^|]*\|$", section("### What to expect"), flags=re.MULTILINE)
    return dict(rows)


def test_every_extra_the_readme_names_exists_in_pyproject():
    table = extras_table()
    assert set(table.values()) >= {"tokenizers", "plot", "recipes", "test"}, table
    assert set(table.values()) <= set(EXTRAS), set(table.values()) - set(EXTRAS)
    for extra in table.values():  # the extra named is the one the README tells users to install
        assert re.search(rf'\.\[[\w,]*\b{extra}\b[\w,]*\]', README) or f"`{extra}`" in README


def _third_party_imports(paths) -> set[str]:
    """Return the top-level modules ``paths`` import that are neither stdlib, sortpack, torch nor local."""
    local = {p.stem for p in paths}
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {DISTRIBUTIONS.get(m, m) for m in found if m not in sys.stdlib_module_names and m not in local
            and m not in ("sortpack", "torch", "numpy", "pyarrow", "__future__", "flash_attn")}


DISTRIBUTIONS = {"megatron": "megatron-core", "PIL": "pillow"}  # import names whose distribution is named otherwise


def test_each_command_row_names_the_extra_that_holds_what_it_imports():
    table = extras_table()
    flags = ("--tokenizer", "--plot", "examples/recipes")
    by_flag = {flag: table[next(k for k in table if flag in k)] for flag in flags}
    # --tokenizer loads `tokenizers`; --plot draws with matplotlib (sortpack/report/plot.py)
    assert "tokenizers" in requirement_names(by_flag["--tokenizer"])
    assert "from tokenizers import" in (ROOT / "sortpack" / "inputs" / "specs.py").read_text()
    assert "matplotlib" in requirement_names(by_flag["--plot"])
    assert "from matplotlib" in (ROOT / "sortpack" / "report" / "plot.py").read_text()
    # every trainer library a recipe imports is in the extra the README names for the recipes
    recipes = sorted((ROOT / "examples" / "recipes").glob("*.py"))
    imported = _third_party_imports(recipes)
    assert {"transformers", "accelerate", "lightning"} <= imported  # the scan sees the recipes' imports
    assert imported <= requirement_names(by_flag["examples/recipes"]), imported - requirement_names(
        by_flag["examples/recipes"])
    # the test extra holds every optional library the suite imports
    assert requirement_names("tokenizers") | requirement_names("plot") | requirement_names("recipes") <= \
        requirement_names("test")
