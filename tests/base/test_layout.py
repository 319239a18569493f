"""Who may import whom inside sortpack (docs/architecture.md): every module, direct and transitive imports."""
from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

PKG = ROOT / "sortpack"

# the sides of the package, by top-level name (a module or a subpackage of sortpack)
BASE = {"errors", "env", "parallel", "partition", "distribute", "progress", "launcher", "kernels", "permutation",
        "row_store", "arrow_types", "arrow_compute", "shadowing"}
SIDES = {
    **{b: "base" for b in BASE},
    "inputs": "inputs", "format": "format", "stages": "stages", "write": "write",
    "reader": "reader", "dataset": "reader", "train": "train", "torch": "train", "plan_node": "train",
    "lightning": "train",
    "report": "report", "pipeline": "pipeline", "cli": "cli", "__main__": "cli", "__init__": "base",
    "batch": "batch",
}
# side -> the sides it may import (besides itself)
MAY_IMPORT = {
    "base": {"base"},
    "format": {"errors", "env"},  # the on-disk contract: no MPI, no writer, no stage
    "inputs": {"base", "format"},
    "stages": {"base", "inputs"},
    "write": {"base", "format", "inputs", "stages"},
    # never parallel, stages or writers
    "reader": {"errors", "launcher", "permutation", "row_store", "arrow_types", "kernels", "format", "inputs"},
    # training-loop helpers beside the reader: the reader's rules, plus the reader; the reader never imports them
    "train": {"errors", "launcher", "permutation", "row_store", "arrow_types", "kernels", "format", "inputs", "reader"},
    "report": {"errors", "format", "inputs", "reader"},
    # one in-memory batch planned with the pack stage (sortpack.plan_batch): no writer, no directory, no MPI call;
    # the reader's MicroBatch and collate for what it hands a training loop
    "batch": {"base", "stages", "reader"},
    "pipeline": {"base", "format", "inputs", "stages", "write"},
    "cli": {"base", "format", "inputs", "stages", "write", "reader", "report", "pipeline"},
}
# what ``sortpack/__init__.py`` hands out lazily (``sortpack.plan_batch``), importing it only when asked
PACKAGE_DOORS = {"batch"}
# within base, the finer rule: kernels and errors stand alone, only parallel's helpers use parallel
BASE_MAY_IMPORT = {
    "__init__": set(), "errors": set(), "env": set(), "kernels": {"env"}, "launcher": {"errors"}, "progress": set(),
    "permutation": set(), "row_store": {"kernels", "arrow_types", "env"}, "arrow_types": set(), "arrow_compute": set(),
    "parallel": {"errors", "env", "launcher"}, "partition": {"parallel"}, "distribute": {"parallel", "partition"},
    "shadowing": set(),
}


@functools.cache
def _tree(path: Path) -> ast.Module:
    """Return the parsed module at ``path`` (parsed once for every rule below)."""
    return ast.parse(path.read_text())


def _module_imports(path: Path) -> set[str]:
    """Return the sortpack top-level names (e.g. "format", "stages") that ``path`` imports, lazily or not."""
    rel = path.relative_to(PKG).with_suffix("").parts
    package = rel[:-1]
    found = set()
    for node in ast.walk(_tree(path)):
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
            else:  # "from .. import kernels": the names are modules of the package
                found.update(a.name for a in node.names if (PKG / a.name).exists()
                             or (PKG / f"{a.name}.py").exists())
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "sortpack" and len(parts) > 1:
                    found.add(parts[1])
    return found - {rel[0]}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        yield path.relative_to(PKG).with_suffix("").parts[0], path


def test_every_module_has_a_side():
    unknown = sorted({name for name, _ in _modules()} - set(SIDES))
    assert not unknown, f"modules without a side in test_layout.SIDES: {unknown}"


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda v: str(v))
def test_imports_follow_the_sides(name, path):
    side = SIDES[name]
    allowed_sides = MAY_IMPORT[side] | {side}
    bad = set()
    for other in _module_imports(path):
        other_side = SIDES.get(other, other)
        if side == "base":
            if other not in BASE_MAY_IMPORT[name] and not (name == "__init__" and other in PACKAGE_DOORS):
                bad.add(other)
        elif other_side not in allowed_sides and other not in allowed_sides:
            bad.add(other)
    assert not bad, f"{path.relative_to(PKG.parent)} ({side}) imports {sorted(bad)}; see docs/architecture.md"


# pipeline/ strings stages into jobs: compiled kernels and the deals of rows to ranks are the stages' work
PIPELINE_MAY_NOT_IMPORT = {"kernels", "partition"}


def test_the_pipeline_only_orchestrates():
    for path in sorted((PKG / "pipeline").rglob("*.py")):
        found = _module_imports(path) & PIPELINE_MAY_NOT_IMPORT
        assert not found, (f"{path.relative_to(PKG.parent)} imports {sorted(found)}: its computation belongs in a "
                           f"stage (sortpack/stages/), see docs/architecture.md")


def _calls(path: Path) -> set[str]:
    """Return the names ``path`` calls (``f(...)`` and ``x.f(...)`` both give ``f``)."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "")
    return names


# what pipeline/ writes once for every plan (run, pack, a mixture): the module that owns it, what only it calls
PIPELINE_ONCE = {
    "columns.py": {"check_columns", "resolve_column", "first_columns", "input_columns"},  # the column policy
    "tail.py": {"pack_samples", "write_index", "split_holdout"},  # hold out, pack, write both plans
}


@pytest.mark.parametrize("owner", sorted(PIPELINE_ONCE))
def test_the_pipeline_writes_the_column_policy_and_the_tail_once(owner):
    for path in sorted((PKG / "pipeline").rglob("*.py")):
        found = _calls(path) & PIPELINE_ONCE[owner] if path.name != owner else set()
        assert not found, (f"{path.relative_to(PKG.parent)} calls {sorted(found)}: that is pipeline/{owner}'s "
                           f"(one rule for every plan), see docs/architecture.md")


def test_a_mixture_is_one_stage_package():
    # the union's analysis, part passes, blend and move are stages/mixture/'s; the pipeline only strings them
    loose = sorted(p.name for p in (PKG / "stages").glob("*.py") if p.stem in {"mixture", "blend", "part_pass"})
    assert not loose and (PKG / "stages" / "mixture" / "__init__.py").exists(), loose
    assert "analyze" not in _calls(PKG / "pipeline" / "mixture.py"), "pipeline/mixture.py analyzes: stages/mixture's"


# the pack stage, bottom up: what reads no options (the --budget registry, the per-micro-batch records, the orders of
# --balance and its registry), the options, then what reads them: what fits, the arrays of a cut, the rows composed
# by their targets, best fit over every cap, how to cut, the entry
PACK_LAYERS = ["budgets", "packed", "order", "balance", "options", "fits", "batches", "compose", "bestfit", "cut",
               "microbatches"]


def test_the_pack_stage_is_layered_from_its_registries_and_options_up():
    found = {p.stem for p in (PKG / "stages" / "pack").glob("*.py")}
    assert found == {"__init__", *PACK_LAYERS}, f"stages/pack/ holds {sorted(found)}; see docs/architecture.md"
    graph = _module_graph()
    for i, name in enumerate(PACK_LAYERS):
        above = {f"sortpack.stages.pack.{m}" for m in PACK_LAYERS[i + 1:]} | {"sortpack.stages.pack"}
        up = sorted(graph[f"sortpack.stages.pack.{name}"] & above)
        assert not up, f"stages/pack/{name}.py imports {up}, above it in the room; see docs/architecture.md"


# what --help lists loads no numpy: the registries of the pack stage and the measures, as the formats and size kinds
LIGHT_REGISTRIES = ("sortpack.stages.pack.budgets", "sortpack.stages.pack.balance", "sortpack.inputs.measures")


def test_the_registries_load_no_numpy():
    for module, loaded in _loaded_after_imports(LIGHT_REGISTRIES).items():
        assert not [m for m in loaded if m.split(".")[0] in ("numpy", "pyarrow", "mpi4py")], (module, loaded)


def _side_imports(name: str) -> set[str]:
    """Return what every module of top-level ``name`` (a module or a package) imports."""
    paths = [PKG / f"{name}.py"] if (PKG / f"{name}.py").exists() else list((PKG / name).rglob("*.py"))
    return set().union(*(_module_imports(p) for p in paths))


def test_the_checker_sees_relative_and_lazy_imports():
    # the rules above are only as good as the import finder: it must see imports inside functions
    assert {"pipeline", "errors", "report", "parallel", "format"} <= _side_imports("cli")
    assert {"parallel", "partition", "kernels"} <= _side_imports("stages")


# each module is imported in a process of its own, forked from one that imported only ``preload``: a fresh
# interpreter per module, without paying each its start-up and numpy's and pyarrow's import again
_FORKS = """
import importlib, json, os, sys
for name in PRELOAD:
    importlib.import_module(name)
out = {}
for module in MODULES:
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            found = sorted(sys.modules)
        except BaseException as exc:
            found = ["error: " + repr(exc)]
        os.write(write, json.dumps(found).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        out[module] = json.loads(fh.read())
    os.wait()
print(json.dumps(out))
"""


def _loaded_after_imports(modules: tuple[str, ...], preload: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Return, per module, the modules a fresh process (which imported ``preload`` first) has after importing it."""
    code = f"PRELOAD = {list(preload)!r}\nMODULES = {list(modules)!r}\n{_FORKS}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(ROOT), env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    errors = {m: names for m, names in loaded.items() if names and names[0].startswith("error: ")}
    assert not errors, errors
    return loaded


def _loaded_after_import(module: str) -> list[str]:
    """Return the modules loaded in a fresh interpreter by ``import module``."""
    return _loaded_after_imports((module,))[module]


READER_MODULES = sorted({"sortpack.reader", "sortpack.dataset", "sortpack.torch", "sortpack.train"} | {
    f"sortpack.{side}." + p.stem for side in ("reader", "train") for p in (PKG / side).glob("*.py")
    if p.stem != "__init__"})


# what only a training loop needs: the reader (what the plan says) does not define it
TRAINING_HELPERS = ("VariableBatchSizeLR", "step_loss", "step_targets", "GoodputController", "NoiseScale",
                    "StepTimeModel", "choose_accum")


def test_the_reader_defines_no_training_helper():
    for path in sorted((PKG / "reader").rglob("*.py")):
        defined = {n.name for n in ast.walk(_tree(path))
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        found = defined & set(TRAINING_HELPERS)
        assert not found, f"{path.relative_to(PKG.parent)} defines {sorted(found)}: it belongs in sortpack/train/"
        assert "train" not in _module_imports(path), f"{path.relative_to(PKG.parent)} imports sortpack.train"


def test_reader_side_loads_no_mpi_no_writer_and_no_torch():
    # numpy and pyarrow may load (the reader reads arrays): loaded once, before the forks
    loaded = _loaded_after_imports(tuple(READER_MODULES), preload=("numpy", "pyarrow", "pyarrow.ipc"))
    assert sorted(loaded) == READER_MODULES
    forbidden = {module: [m for m in names if m in ("mpi4py", "torch", "sortpack.parallel", "sortpack.distribute")
                          or m.startswith(("sortpack.stages", "sortpack.write", "sortpack.pipeline", "sortpack.cli",
                                           "mpi4py.", "torch."))] for module, names in loaded.items()}
    assert not {m: f for m, f in forbidden.items() if f}, "a reader-side module loads MPI, a writer or torch"


BATCH_MODULES = sorted({"sortpack.batch"} | {f"sortpack.batch.{p.stem}" for p in (PKG / "batch").glob("*.py")
                                             if p.stem not in ("__init__", "verl", "trl")})


@pytest.mark.parametrize("module", BATCH_MODULES)
def test_the_batch_door_loads_no_mpi_no_arrow_no_torch_and_no_writer(module):
    # a trainer under torchrun calls plan_batch on every step: it must not start MPI, and it stays cheap to import
    loaded = _loaded_after_import(module)
    forbidden = [m for m in loaded if m.split(".")[0] in ("mpi4py", "torch", "pyarrow")
                 or m.startswith(("sortpack.write", "sortpack.pipeline", "sortpack.cli"))]
    assert not forbidden, f"import {module} loads {forbidden}"


def test_format_loads_no_mpi():
    loaded = _loaded_after_import("sortpack.format")
    assert "mpi4py" not in loaded and "sortpack.parallel" not in loaded


def test_nothing_imports_the_cli():
    for name, path in _modules():
        if name not in ("cli", "__main__"):
            assert "cli" not in _module_imports(path), path


# Values that travel together are one record (docs/architecture.md, "Records instead of loose parameters"): no
# function of the package takes more than five parameters, but the public constructors whose documented keywords a
# training script writes, and the entry points listed here with why. The list only shrinks.
MAX_PARAMETERS = 5
PUBLIC_KEYWORDS = {
    "reader/collate_pad.py:PadCollate.__init__", "reader/collate_pad.py:pad_collate",
    "reader/collate_varlen.py:VarlenCollate.__init__", "reader/collate_varlen.py:varlen_collate",
    "reader/dataset.py:SourceDataset.__init__", "reader/microbatch.py:MicroBatch.__init__",
    "reader/plan.py:EpochPlan.__init__", "reader/sampler.py:PackedSampler.__init__",
    "train/goodput_controller.py:GoodputController.__init__",
    # plan_batch's keywords are the trainers' names (docs/plan-batch.md); the verl adapter keeps verl's signature
    "batch/plan.py:plan_batch", "batch/verl.py:rearrange_micro_batches",
}
MANY_PARAMETERS = {
    # the kernels' entry points: each parameter is one of the C kernel's arguments, by keyword
    "kernels/greedy.py:greedy_pack", "kernels/greedy.py:greedy_pack_reference", "kernels/gather.py:gather_bytes",
    "kernels/fit.py:fit_pack", "kernels/fit.py:fit_pack_reference", "kernels/tokens.py:BatchKernels.pad_batch",
    # the on-disk contract's optional columns, each a documented keyword (docs/format.md)
    "format/schemas.py:index_schema", "format/schemas.py:kind_schema",
    # not yet records (issue 47 leaves them): a fine-tuning shape's options, a SPEC's evaluation, the index shards'
    # and a mixture's deals, the sort's entry
    "inputs/finetune/registry.py:fine_tune_shape", "inputs/specs.py:evaluate", "partition.py:index_shard_cuts",
    "partition.py:index_shard_layout", "stages/mixture/blend.py:plan_blend",
    "stages/mixture/part_pass.py:part_pass_samples", "stages/mixture/part_pass.py:select_part",
    "stages/sort.py:sort_samples",
}


def _parameter_counts(path: Path) -> dict[str, int]:
    """Return each function's parameters (``self``/``cls``, ``*args`` and ``**kwargs`` aside) by ``file:qualname``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                if in_class and names and names[0] in ("self", "cls"):
                    names = names[1:]
                out[f"{path.relative_to(PKG).as_posix()}:{prefix}{child.name}"] = len(names)
                visit(child, f"{prefix}{child.name}.", False)

    visit(_tree(path), "", False)
    return out


def test_functions_take_records_not_loose_parameters():
    counts = {}
    for path in sorted(PKG.rglob("*.py")):
        counts.update(_parameter_counts(path))
    assert "reader/sampler.py:PackedSampler.__init__" in counts and "cli/job.py:job_command" in counts
    many = {k for k, n in counts.items() if n > MAX_PARAMETERS}
    assert many - PUBLIC_KEYWORDS - MANY_PARAMETERS == set(), "more than five parameters: take a record"
    assert (PUBLIC_KEYWORDS | MANY_PARAMETERS) - many == set(), "listed but no longer needed: drop from the list"


# A module does one job, a function one step of it (docs/architecture.md, "Size of modules"): the ones over the limits
# are listed, and the list only shrinks (issue 47 gave these to the helpers that split them).
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
LONG_MODULES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()


def _function_lines(path: Path) -> dict[str, int]:
    """Return each function's lines (its decorators aside, its docstring included) by ``file:qualname``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[f"{path.relative_to(PKG).as_posix()}:{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")

    visit(_tree(path), "")
    return out


def test_modules_and_functions_stay_short():
    paths = sorted(PKG.rglob("*.py"))
    long_modules = {p.relative_to(PKG).as_posix() for p in paths if len(p.read_text().splitlines()) > MAX_MODULE_LINES}
    lines = {k: n for p in paths for k, n in _function_lines(p).items()}
    long_functions = {k for k, n in lines.items() if n > MAX_FUNCTION_LINES}
    assert long_modules - LONG_MODULES == set(), f"modules over {MAX_MODULE_LINES} lines: give each job its module"
    assert long_functions - LONG_FUNCTIONS == set(), f"functions over {MAX_FUNCTION_LINES} lines: name their steps"
    stale = (LONG_MODULES - long_modules) | (LONG_FUNCTIONS - long_functions)
    assert not stale, f"listed as long but no longer: drop {sorted(stale)} from the lists"


def _module_name(path: Path) -> str:
    """Return the dotted name of a module file of the package (a package's ``__init__`` is the package)."""
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph() -> dict[str, set[str]]:
    """Return, per module of the package, the modules it imports (at the top, lazily, or for type checking only)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        # an import for type checking only is an edge too: the two modules cannot be read (or checked) apart
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    target = ".".join(base + (node.module.split(".") if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in files else target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_counts_lazy_and_type_checking_imports():
    graph = _module_graph()
    assert "sortpack.stages.pack.order" in graph["sortpack.stages.pack.balance"]  # inside a method
    assert "sortpack.write.owned" in graph["sortpack.write.store.plan"]  # under TYPE_CHECKING


def test_no_import_circles_between_modules():
    # a lazy import inside a function, or one for type checking only, is still a circle: the two modules cannot be
    # loaded, tested or read apart
    circles = _circles(_module_graph())
    assert not circles, f"modules that import each other (directly or around a circle): {circles}"


# what one module owns: the only importer of a library (docs/architecture.md, "The sides")
ONLY_IMPORTER = {"mpi4py": "parallel.py", "pyarrow.fs": "inputs/objects.py"}


def _imported_libraries(path: Path) -> set[str]:
    """Return every absolute module name ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("library", sorted(ONLY_IMPORTER))
def test_one_module_owns_each_library(library):
    owners = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
                    if any(n == library or n.startswith(library + ".") for n in _imported_libraries(p)))
    assert owners == [ONLY_IMPORTER[library]], f"{library} is imported by {owners}; see docs/architecture.md"


# tests/ mirrors the package: a folder per side (or subpackage), base/ for the base modules, docs/ for what
# the README and docs/ promise, and the two suites that cut across sides (mpi/ runs under mpiexec)
TESTS = ROOT / "tests"
TEST_FOLDERS_BESIDE_THE_SIDES = {"base", "docs", "mpi", "reliability"}


def test_no_loose_test_files_at_the_top_of_tests():
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test files at the top of tests/: {loose}; put each in the folder of what it tests"


def test_every_test_folder_mirrors_the_package():
    sides = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    stray = sorted(folders - sides - TEST_FOLDERS_BESIDE_THE_SIDES)
    assert not stray, f"test folders that mirror no part of sortpack/: {stray}"
    base_tests = {p.stem.removeprefix("test_") for p in (TESTS / "base").glob("test_*.py")}
    assert {"arrow_types", "arrow_compute", "errors", "launcher", "partition", "progress", "row_store"} <= base_tests


# a stage or the store takes its options as typed records (``stages.plan_options.PlanOptions`` and the options it
# holds), never as a dict: ``stages/plan_options.py`` is the one reader of the manifest's recorded options
OPTION_NAMES = {"options", "opts", "recorded", "measured", "popts", "aopts", "sopts", "fine_tune"}


def test_stages_and_the_store_take_options_as_records_not_dicts():
    found = []
    for path in [*sorted((PKG / "stages").rglob("*.py")), *sorted((PKG / "write" / "store").rglob("*.py"))]:
        if path.name == "plan_options.py":
            continue
        for node in ast.walk(_tree(path)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                text = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if arg.arg in OPTION_NAMES and (not text or "dict" in text.lower()):
                    found.append(f"{path.relative_to(PKG)}:{node.lineno} {node.name}({arg.arg}: {text or '?'})")
    assert not found, f"options passed as a dict (or untyped) where a typed record belongs: {found}"


def _reads_recorded_options(node: ast.AST) -> bool:
    """Return whether ``node`` reads a manifest's ``options`` object (``m["options"]`` or ``m.get("options")``)."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "options"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "options")


def test_a_manifest_s_options_are_read_back_only_as_plan_options():
    # the stages, writers and jobs read a manifest's options once, typed: PlanOptions.from_manifest(m["options"])
    found = []
    for side in ("stages", "write", "pipeline"):
        for path in sorted((PKG / side).rglob("*.py")):
            tree = _tree(path)
            allowed = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
                       and isinstance(call.func, ast.Attribute) and call.func.attr == "from_manifest"}
            found += [f"{path.relative_to(PKG)}:{node.lineno}" for node in ast.walk(tree)
                      if _reads_recorded_options(node) and id(node) not in allowed]
    assert not found, f"a manifest's options read as a dict (use PlanOptions.from_manifest): {found}"
