"""The import graph of polar_mq: no import cycle between packages nor between modules (beyond
the known ones of issue 36, listed to shrink), every package in its layer, no module over 500
lines, and a tests folder for every package of four or more modules.

Read from the source with `ast` (every import counts: module level, inside functions and under
`TYPE_CHECKING`), so a cycle hidden in a function-level import fails here too. A "package" is a
subpackage of polar_mq (`polar_mq.jobs`) or a top-level module (`polar_mq.config`); a "module" is
one file.
"""

from __future__ import annotations

import ast
import graphlib
import itertools
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "polar_mq"
MAX_LINES = 500
LAYERS: dict[str, frozenset[str]] = {
    "foundation": frozenset({"capability", "config", "infra", "models", "spec"}),
    "domain": frozenset(
        {
            "calls", "evaluators", "harnesses", "jobs", "lifecycle", "policy", "retention",
            "rollouts", "runtimes", "swe", "tenants", "trajectories",
        }
    ),
    "services": frozenset({"dispatch", "inference", "observability", "proxy", "workers"}),
    "front": frozenset({"api", "client", "ui"}),
    "tools": frozenset({"agents", "bridges", "cli", "stack", "testing", "training"}),
}  # fmt: skip
"""The layers, lowest first: a package imports packages of its own layer or of lower ones, never
of a higher one (docs/architecture.md says what each holds). Within a layer the package cycle
test keeps the order acyclic, and `CHAINS` pin the order that matters."""
CHAINS = [
    ["spec", "models", "lifecycle", "policy", "jobs", "dispatch", "workers"],
    ["api", "ui", "cli"],
]
"""Each package of a chain never reaches (directly or not) one after it in the same chain."""
Edges = dict[str, dict[str, set[str]]]
"""package -> imported package -> files (relative to the repository) that import it."""


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported(path: Path, tree: ast.AST) -> set[str]:
    """The dotted polar_mq modules (or packages) that `path` imports: `from a.b import c` names
    the module `a.b.c` when that is a file of the package, else `a.b` (c is a name in it)."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                keep = len(module) - node.level + (1 if is_package else 0)
                base = ".".join(module[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in _module_files() else base)
    return {name for name in found if name.startswith("polar_mq.")}


@cache
def _module_files() -> dict[str, Path]:
    """Every module of polar_mq by its dotted name (a package by its own, for its __init__)."""
    return {".".join(_module_name(path)): path for path in sorted(ROOT.rglob("*.py"))}


@cache
def package_edges() -> Edges:
    edges: Edges = defaultdict(lambda: defaultdict(set))
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "__init__.py":
            continue
        source = _package_of(path)
        for name in _imported(path, ast.parse(path.read_text(), str(path))):
            target = name.split(".")[1]
            if target != source:
                edges[source][target].add(str(path.relative_to(ROOT.parent)))
    return edges


def _describe(edges: Edges, cycle: list[str]) -> str:
    lines = []
    for source, target in itertools.pairwise(cycle):
        lines.append(f"  {source} -> {target}: {', '.join(sorted(edges[source][target]))}")
    return "\n".join(lines)


def _reachable(edges: Edges, start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in edges.get(todo.pop(), {}):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_reader_sees_the_imports_it_must() -> None:
    """The graph is not empty by accident: known edges of the code base are found."""
    edges = package_edges()
    assert "polar_mq/workers/runner.py" in edges["workers"]["lifecycle"]
    assert "polar_mq/jobs/service.py" in edges["jobs"]["policy"]
    # `from polar_mq.capability import receipts as call_receipts`: a module imported by name
    assert "polar_mq/workers/context.py" in edges["workers"]["capability"]


def test_no_import_cycle_between_packages() -> None:
    edges = package_edges()
    sorter = graphlib.TopologicalSorter({source: set(targets) for source, targets in edges.items()})
    cycle: list[str] = []
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        cycle = list(reversed(error.args[1]))  # graphlib lists it against the import direction
    if cycle:
        message = f"package import cycle {' -> '.join(cycle)}:\n{_describe(edges, cycle)}"
        pytest.fail(message, pytrace=False)


def _packages() -> set[str]:
    return {_package_of(path) for path in ROOT.rglob("*.py") if path != ROOT / "__init__.py"}


def _layer_of() -> dict[str, int]:
    return {package: i for i, members in enumerate(LAYERS.values()) for package in members}


def test_every_package_has_its_layer() -> None:
    layer_of = _layer_of()
    placed = [p for members in LAYERS.values() for p in members]
    assert len(placed) == len(layer_of), "a package is in two layers"
    unplaced = sorted(_packages() - set(layer_of))
    assert not unplaced, (
        f"packages in no layer (add each to LAYERS and docs/architecture.md): {unplaced}"
    )
    gone = sorted(set(layer_of) - _packages())
    assert not gone, f"LAYERS names packages that are gone: {gone}"


@pytest.mark.parametrize("layer", list(LAYERS))
def test_a_layer_imports_only_its_own_or_lower_ones(layer: str) -> None:
    """Direct imports only downwards (or within the layer), so transitive ones too."""
    edges = package_edges()
    layer_of = _layer_of()
    names = list(LAYERS)
    wrong = [
        f"{source} ({layer}) -> {target} ({names[layer_of[target]]}): {sorted(files)}"
        for source in sorted(LAYERS[layer])
        for target, files in sorted(edges.get(source, {}).items())
        if layer_of.get(target, -1) > layer_of[source]
    ]
    assert not wrong, "imports of a higher layer:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("chain", "index"), [(c, i) for c in range(len(CHAINS)) for i in range(len(CHAINS[c]))]
)
def test_a_chain_imports_only_downwards(chain: int, index: int) -> None:
    """spec < models < lifecycle < policy < jobs < workers, api < ui < app < cli: transitively."""
    edges = package_edges()
    package = CHAINS[chain][index]
    above = set(CHAINS[chain][index + 1 :])
    wrong = sorted(_reachable(edges, package) & above)
    assert not wrong, f"{package} reaches {wrong}: " + "; ".join(
        f"{package} -> {t}: {sorted(files)}" for t, files in edges[package].items()
    )


def module_edges() -> dict[str, set[str]]:
    """module -> the polar_mq modules it imports (dotted, without the `polar_mq.` prefix)."""
    edges: dict[str, set[str]] = {}
    for name, path in _module_files().items():
        targets = _imported(path, ast.parse(path.read_text(), str(path)))
        edges[name.removeprefix("polar_mq.")] = {
            t.removeprefix("polar_mq.") for t in targets if t in _module_files() and t != name
        }
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(edges) == [{"a", "b", "c"}]


def test_no_import_cycle_between_modules() -> None:
    """Issue 36: no module cycle in polar_mq, TYPE_CHECKING imports included."""
    edges = module_edges()
    lines = []
    for cycle in _cycles(edges):
        inner = {m: sorted(edges[m] & cycle) for m in sorted(cycle)}
        lines.append("module cycle:\n" + "\n".join(f"  {m} -> {t}" for m, t in inner.items()))
    if lines:
        pytest.fail("\n".join(lines), pytrace=False)


def test_no_module_over_500_lines() -> None:
    too_long = {
        str(path.relative_to(ROOT.parent)): n
        for path in sorted(ROOT.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines (split them): {too_long}"


def test_every_package_of_four_or_more_modules_has_its_tests_folder() -> None:
    """`tests/<package>/` with tests of its own, for each subpackage of polar_mq holding four or
    more modules (its own subpackages' counted in: their tests live in the package's folder)."""
    tests = Path(__file__).resolve().parent
    missing = []
    for package in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file()):
        modules = [m for m in package.rglob("*.py") if m.name != "__init__.py"]
        if len(modules) >= 4 and not any((tests / package.name).glob("test_*.py")):
            missing.append(f"{package.name} ({len(modules)} modules)")
    assert not missing, f"packages without tests/<package>/test_*.py: {missing}"
