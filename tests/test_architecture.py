"""The package graph of polar_mq: no import cycle between packages, the layers in their order, no
module over 500 lines, and a tests folder for every package of four or more modules.

Read from the source with `ast` (every import counts: module level, inside functions and under
`TYPE_CHECKING`), so a cycle hidden in a function-level import fails here too. A "package" is a
subpackage of polar_mq (`polar_mq.jobs`) or a top-level module (`polar_mq.config`).
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
LAYERS = ["spec", "models", "lifecycle", "policy", "jobs"]
"""Each may import the ones before it and never one after it (nor api or workers, the top)."""
TOP = ["api", "workers"]

Edges = dict[str, dict[str, set[str]]]
"""package -> imported package -> files (relative to the repository) that import it."""


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported(path: Path, tree: ast.AST) -> set[str]:
    """The dotted polar_mq modules (or packages) that `path` imports."""
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
            if base == "polar_mq":  # `from polar_mq import db_json`: the names are modules
                found.update(f"polar_mq.{alias.name}" for alias in node.names)
            else:
                found.add(base)
    return {name for name in found if name.startswith("polar_mq.")}


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
    assert "db_json" in edges["db"]  # `from polar_mq import db_json`


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


@pytest.mark.parametrize("index", range(len(LAYERS)))
def test_layers_import_only_downwards(index: int) -> None:
    """spec < models < lifecycle < policy < jobs < {api, workers}, transitively."""
    edges = package_edges()
    layer = LAYERS[index]
    above = set(LAYERS[index + 1 :]) | set(TOP)
    wrong = sorted(_reachable(edges, layer) & above)
    assert not wrong, f"{layer} reaches {wrong}: " + "; ".join(
        f"{layer} -> {t}: {sorted(files)}" for t, files in edges[layer].items()
    )


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
