"""The suite's own layout: what pytest needs to collect every test module of every worker."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_module_basenames_are_unique() -> None:
    """Test folders are not packages, so pytest imports each test module by its basename: a
    second `test_x.py` anywhere fails collection ("import file mismatch") on whichever worker
    collects both, after the rest of the suite ran (a CI run lost its green so)."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
