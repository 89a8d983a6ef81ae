"""The package's floors: imports run one way between ``lightrec`` subpackages and never in a circle.

Every ``import`` statement of every file under ``lightrec/`` is read from its syntax tree -- at
module level, inside functions and under ``if TYPE_CHECKING:`` alike, since a function-level
import is still a dependency (it only hides a circle until the function runs). The rules, also
drawn in ``docs/architecture.md``:

* a room (subpackage, or top-level module) imports only the rooms ``ALLOWED`` lists for it;
* no circle between files;
* nothing below ``lightrec.lightning`` imports Lightning (``data`` and ``metrics`` sit beside the
  stack and may, for DataModules and torchmetrics; ``_compat.py`` imports it lazily, by design);
* training code never imports the serving workflow: in ``lightrec.lightning`` only the export
  callback imports ``lightrec.inference``;
* the recipes that ``lightrec cp`` hands to users import public modules only.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightrec"
# The top-level recipes/ folder installs as lightrec.recipes (pyproject's package-dir): one more room.
RECIPES = ROOT / "recipes"

# Leaf modules every room may import: torch-version shims, the fbgemm / Triton availability
# checks, the native-op loader, huge-page host buffers, the malloc policy, the SIGTERM flag, the environment switches,
# the version string and the value-printing enum base. They import nothing of lightrec's but each other
# (the switches import nothing).
FOUNDATION = frozenset(
    {"_compat", "_enum", "_fbgemm", "_host_memory", "_malloc_policy", "_native", "_stop_signal", "_suggest", "_switches",
     "_triton", "_version"}
)

# room -> the rooms it may import (besides itself and FOUNDATION). Reading down the table climbs
# the floors: sparse <- modules <- kernels / quant / fx <- distributed <- inference <- lightning
# <- recipes; optim, models, data and metrics sit beside the stack.
ALLOWED: dict[str, frozenset[str]] = {
    "sparse": frozenset(),
    "optim": frozenset({"sparse"}),
    "metrics": frozenset(),
    "modules": frozenset({"sparse"}),
    "models": frozenset({"sparse", "modules"}),
    "data": frozenset({"sparse", "modules"}),
    # torchrec's torchrec.datasets paths, thin layers over lightrec.data (beside the stack, like data)
    "datasets": frozenset({"sparse", "modules", "data"}),
    "kernels": frozenset({"sparse", "modules", "optim"}),
    "quant": frozenset({"sparse", "modules"}),
    "fx": frozenset({"sparse", "modules"}),
    # torchrec.ir: the torch.export round trip of the collections (serializers over modules, like fx)
    "ir": frozenset({"sparse", "modules"}),
    # fx: the train pipeline's tracer builds on lightrec.fx's; streamable: the batch protocols
    "distributed": frozenset({"sparse", "modules", "optim", "kernels", "quant", "fx", "streamable"}),
    "inference": frozenset({"sparse", "modules", "optim", "kernels", "quant", "fx", "distributed"}),
    # `lightrec serve` (LitServe): on top of inference; nothing imports it but the cli (training never does)
    "serving": frozenset({"sparse", "modules", "optim", "kernels", "quant", "fx", "distributed", "inference"}),
    "lightning": frozenset(
        {
            "sparse",
            "modules",
            "optim",
            "kernels",
            "quant",
            "fx",
            "distributed",
            "inference",
            "data",
            "metrics",
        }
    ),
    "recipes": frozenset(
        {"sparse", "modules", "optim", "models", "data", "metrics", "kernels", "inference", "lightning"}
    ),
    "cli": frozenset({"recipes", "lightning", "inference", "distributed", "serving", "data"}),
    "__main__": frozenset({"cli"}),  # `python -m lightrec`: the `lightrec` command
    # the flat torchrec-style namespace (lightrec/__init__.py) and what a source checkout needs
    "lightrec": frozenset({"sparse", "modules", "optim", "kernels", "_source_tree"}),
    "_source_tree": frozenset(),
    # torchrec.test_utils: helpers for tests of code built on lightrec (free ports, sanitizer skips)
    "test_utils": frozenset(),

    # torchrec.types (DataType and the module mixins) and torchrec.streamable (the batch protocols)
    "types": frozenset({"sparse", "modules"}),
    "streamable": frozenset(),
}
ALLOWED.update({name: frozenset() for name in FOUNDATION})

# Mirrors of torchrec's module paths whose contents live a floor higher than torchrec's path puts
# them (issue 17: `sed s/torchrec/lightrec/` on imports must work). Each one is a re-export only,
# may import the rooms listed here besides its own room's, and no file of lightrec may import it
# (test_mirrors_are_imported_by_no_lightrec_file), so the exception cannot create a circle or
# a hidden upward dependency. Keep the list short and say why for every entry.
MIRRORS: dict[str, tuple[frozenset[str], str]] = {
    "lightrec.modules.fused_embedding_modules": (
        frozenset({"kernels"}),
        "torchrec.modules.fused_embedding_modules; the fused collections need the batched kernels",
    ),
}

# torchrec's import paths whose code lives elsewhere in lightrec: re-export modules only (imports,
# ``__all__`` and aliases), imported by users, never by a lightrec file, so the grab-bag module
# ``distributed/types.py`` once was cannot grow back.
TORCHREC_PATHS = (
    "lightrec.datasets",
    "lightrec.datasets.criteo",
    "lightrec.datasets.movielens",
    "lightrec.datasets.random",
    "lightrec.datasets.utils",
    "lightrec.distributed.dist_data",
    "lightrec.distributed.embedding_types",
    "lightrec.distributed.mc_embedding",
    "lightrec.distributed.mc_embeddingbag",
    "lightrec.distributed.planner.perf_models",
    "lightrec.distributed.shard",
    "lightrec.distributed.sharding_plan",
    "lightrec.distributed.types",
    "lightrec.metrics.accuracy",
    "lightrec.metrics.mae",
    "lightrec.metrics.mse",
    "lightrec.modules.fused_embedding_modules",
    "lightrec.modules.hash_mc_evictions",
    "lightrec.modules.hash_mc_modules",
    "lightrec.modules.mc_embedding_modules",
    "lightrec.modules.mc_modules",
    "lightrec.optim.apply_optimizer_in_backward",
    "lightrec.optim.optimizers",
    "lightrec.sparse.jagged_tensor",
)

# Rooms below lightrec.lightning: they must run in a process without Lightning.
BELOW_LIGHTNING = (
    "sparse",
    "optim",
    "modules",
    "models",
    "kernels",
    "quant",
    "fx",
    "ir",
    "distributed",
    "inference",
    "serving",  # beside lightning, not below it, but a serving host needs no Lightning either
)
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")
# The one training-side file that hands a model to the serving workflow.
INFERENCE_BRIDGES = frozenset({"lightrec.lightning.callbacks.quantized_export", "lightrec.lightning"})


@dataclass(frozen=True)
class Import:
    source: str  # dotted module of the importing file
    target: str  # dotted module (or package) imported
    line: int
    local: bool  # inside a function or class body


def module_name(path: Path) -> str:
    if path.is_relative_to(RECIPES):
        parts = ("lightrec", "recipes", *path.relative_to(RECIPES).with_suffix("").parts)
    else:
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a file or package of lightrec (``lightrec.recipes.*``: of recipes/)."""
    names = dotted.split(".")
    path = RECIPES.joinpath(*names[2:]) if names[:2] == ["lightrec", "recipes"] else PACKAGE.parent.joinpath(*names)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def source_files() -> list[Path]:
    """Every ``.py`` file of the package and of the recipes."""
    return sorted(PACKAGE.rglob("*.py")) + sorted(RECIPES.rglob("*.py"))


def _stamp(path: Path) -> tuple[int, int]:
    """``path``'s (mtime, size): the key under which its tree and imports are read once per test run (the tests
    here each read every file of the package; ~400 parses per test made this module a minute of the suite)."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.cache
def _parsed(path: Path, stamp: tuple[int, int]) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def parse(path: Path) -> ast.Module:
    """The syntax tree of ``path``, parsed once per :func:`_stamp`."""
    return _parsed(path, _stamp(path))


def _absolute(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, source: str | None = None) -> tuple[Import, ...]:
    """Every import statement of ``path`` that names a lightrec module or a Lightning package.

    ``source``: the dotted name the file is read as (default: its own, from its place in the package).
    Read once per :func:`_stamp`, like :func:`parse`.
    """
    return _imports_of(path, source or module_name(path), _stamp(path))


@functools.cache
def _imports_of(path: Path, source: str, stamp: tuple[int, int]) -> tuple[Import, ...]:
    return tuple(_read_imports(path, source))


def _read_imports(path: Path, source: str) -> Iterator[Import]:
    tree = parse(path)
    local_lines = {
        inner.lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        for inner in ast.walk(node)
        if isinstance(inner, (ast.Import, ast.ImportFrom))
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, source, path.name == "__init__.py")
            # `from pkg import sub` depends on the submodule when `sub` is one, else on pkg itself
            targets = [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in ("lightrec", *LIGHTNING_PACKAGES):
                yield Import(source, target, node.lineno, node.lineno in local_lines)


def all_imports() -> list[Import]:
    return [imp for path in source_files() for imp in imports_of(path)]


def room(dotted: str) -> str:
    """``lightrec.quant.row_codec`` -> ``quant``; ``lightrec`` (the flat namespace) -> ``lightrec``."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def find_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one file, or a file importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return circles


# ---------------------------------------------------------------------------------------- tests
def test_every_room_is_in_the_table() -> None:
    rooms = {room(module_name(p)) for p in source_files()}
    assert rooms <= set(ALLOWED), f"add {sorted(rooms - set(ALLOWED))} to ALLOWED (and docs/architecture.md)"


def test_imports_run_one_way_between_rooms() -> None:
    wrong = []
    for imp in all_imports():
        if not imp.target.startswith("lightrec"):
            continue
        src, dst = room(imp.source), room(imp.target)
        if imp.source in MIRRORS and dst in MIRRORS[imp.source][0]:
            continue
        if dst != src and dst not in FOUNDATION and dst not in ALLOWED[src]:
            where = "function-level" if imp.local else "module-level"
            wrong.append(
                f"{imp.source}:{imp.line} imports {imp.target} ({where}); {src} may import {sorted(ALLOWED[src])}"
            )
    assert not wrong, "imports against the floors:\n" + "\n".join(wrong)


def test_mirrors_are_imported_by_no_lightrec_file() -> None:
    """The guard of ``MIRRORS``: a mirror module is a leaf that only users import."""
    offenders = [f"{imp.source}:{imp.line}" for imp in all_imports() if imp.target in MIRRORS]
    assert not offenders, f"lightrec files import a torchrec-path mirror module: {offenders}"
    for mirror in MIRRORS:
        assert is_module(mirror), f"MIRRORS names {mirror}, which is not a module"


@functools.cache
def importers_by_name() -> dict[str, list[str]]:
    """``module: ["file:line", ...]`` for every ``from module import x`` / ``import module`` of lightrec's files,
    by the name as written (a name of the parent package is not the module)."""
    found: dict[str, list[str]] = {}
    for p in source_files():
        for node in ast.walk(parse(p)):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                found.setdefault(name, []).append(f"{module_name(p)}:{node.lineno}")
    return found


@pytest.mark.parametrize("dotted", TORCHREC_PATHS)
def test_torchrec_paths_only_re_export(dotted: str) -> None:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = parse(path)
    defined = [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    assert not defined, f"{dotted} is a torchrec path: define {defined} in the room's own module and re-export it"
    importers = importers_by_name().get(dotted, [])
    assert not importers, f"lightrec files import the torchrec path {dotted} (import the home module): {importers}"


def test_no_import_circle_between_files() -> None:
    edges: dict[str, set[str]] = {}
    for imp in all_imports():
        if imp.target.startswith("lightrec"):
            edges.setdefault(imp.source, set()).add(imp.target)
    circles = find_circles(edges)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_nothing_below_lightning_imports_lightning() -> None:
    wrong = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in all_imports()
        if room(imp.source) in BELOW_LIGHTNING and imp.target.split(".")[0] in LIGHTNING_PACKAGES
    ]
    assert not wrong, "Lightning imported below lightrec.lightning:\n" + "\n".join(wrong)


def test_training_code_never_imports_the_serving_workflow() -> None:
    wrong = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in all_imports()
        if room(imp.source) == "lightning"
        and room(imp.target) == "inference"
        and imp.target.startswith("lightrec")
        and imp.source not in INFERENCE_BRIDGES
    ]
    assert not wrong, "training code importing lightrec.inference:\n" + "\n".join(wrong)


def test_copied_recipes_import_public_modules_only() -> None:
    from lightrec.recipes import RECIPES

    for recipe in {r.path for r in RECIPES.values()}:
        private = [
            f"{recipe.name}:{imp.line} imports {imp.target}"
            for imp in imports_of(recipe)
            if imp.target.startswith("lightrec")
            and any(part.startswith("_") for part in imp.target.split("."))
        ]
        assert not private, "a recipe `lightrec cp` hands out imports private modules:\n" + "\n".join(private)


# ------------------------------------------------------------------- the checker checks itself
def test_the_checker_finds_function_level_imports_and_circles(tmp_path: Path) -> None:
    inner = tmp_path / "m.py"
    inner.write_text("import os\n\ndef f():\n    from lightrec.inference import export\n    return export\n")
    (found,) = imports_of(inner, "lightrec.distributed.m")
    assert found.target == "lightrec.inference.export" and found.local and found.line == 4
    assert find_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_circles({"a": {"a"}}) == [["a"]]
    assert find_circles({"a": {"b"}, "b": set()}) == []


def test_the_architecture_doc_draws_the_same_table() -> None:
    """docs/architecture.md's "which room may import which" table is ``ALLOWED``, row for row."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    drawn: dict[str, frozenset[str]] = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        name = cells[0].split("`")[1]
        name = {"lightrec/__init__.py": "lightrec"}.get(name, name)
        drawn[name] = frozenset(cells[1].split("`")[1::2])
    rooms = {
        name: allowed
        for name, allowed in ALLOWED.items()
        if name not in FOUNDATION and name != "_source_tree"
    }
    assert drawn == rooms


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_allowed_table_names_real_rooms(name: str) -> None:
    assert is_module(f"lightrec.{name}") or name == "lightrec", f"ALLOWED names {name!r}, which is not a room"
