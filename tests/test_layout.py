"""Who may import whom inside sortpack (docs/architecture.md), checked on the source."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "sortpack"

STAGES = {"analyze", "sort", "pack"}
WRITERS = {"sample_dirs", "index_writer", "provenance", "materialize"}
READER_SIDE = {"reader", "dataset", "torch", "train"}
# modules every layer may use: they know no stage, no directory and no reader
BASE = {"errors", "parallel", "partition", "kernels", "samples", "distribute", "progress", "row_store"}


def _module_imports(path: Path) -> set[str]:
    """Return the sortpack modules (top-level names, e.g. "format", "sort") that ``path`` imports."""
    rel = path.relative_to(PKG).with_suffix("").parts
    package = rel[:-1] if rel[-1] != "__init__" else rel[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "sortpack":
                    continue
                target = parts[1:]
            else:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = list(base) + (node.module.split(".") if node.module else [])
            if target:
                found.add(target[0])
            else:  # "from . import x": x is a module of the package
                found.update(a.name for a in node.names if (PKG / a.name).exists()
                             or (PKG / f"{a.name}.py").exists())
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "sortpack" and len(parts) > 1:
                    found.add(parts[1])
    name = rel[0]
    return found - {name}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("").parts
        yield rel[0], path


# (module, modules it must not import)
RULES = {
    **{s: (STAGES | WRITERS | READER_SIDE | {"pipeline", "cli", "report", "format"}) for s in STAGES},
    **{b: (STAGES | WRITERS | READER_SIDE | {"pipeline", "cli", "report", "format", "sources", "specs"})
       for b in BASE},
    "format": STAGES | WRITERS | READER_SIDE | {"pipeline", "cli", "report", "samples", "distribute", "sources",
                                                "specs"},
    **{w: READER_SIDE | {"pipeline", "cli", "report", "analyze", "sort"} for w in WRITERS},
    "pipeline": READER_SIDE | {"cli", "report"},
    # report shares the sampler's step layout (train.plan), its one home
    "report": STAGES | WRITERS | (READER_SIDE - {"train"}) | {"pipeline", "cli", "parallel", "distribute"},
    **{r: STAGES | WRITERS | {"pipeline", "cli", "report", "parallel", "distribute", "samples"}
       for r in READER_SIDE},
}


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda v: str(v))
def test_imports_follow_the_layers(name, path):
    forbidden = RULES.get(name, set())
    bad = _module_imports(path) & forbidden
    assert not bad, f"{path.relative_to(PKG.parent)} imports {sorted(bad)}; see docs/architecture.md"


def test_nothing_imports_the_cli():
    for name, path in _modules():
        if name not in ("cli", "__main__"):
            assert "cli" not in _module_imports(path), path


def test_the_checker_sees_relative_and_lazy_imports(tmp_path):
    # the rules above are only as good as the import finder: it must see imports inside functions
    imports = _module_imports(PKG / "cli.py")
    assert {"pipeline", "errors", "report", "parallel", "format"} <= imports
    assert {"samples", "parallel", "partition", "kernels"} <= _module_imports(PKG / "pack.py")
    assert {"partition", "errors", "parallel"} <= _module_imports(PKG / "format" / "shards.py")
