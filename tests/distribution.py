"""Which tests must share a pytest-xdist worker, and a scheduler that keeps them together.

`scripts/test` runs the suite with `-n N --dist loadgroup`. Two kinds of tests must not be spread:
every real-vLLM test (they share one server of 4.5 GB and a minute's start, `real_vllm`: one per
machine, not one per worker), and the tests of a module that share a module- or class-scoped
fixture (a stack started once for them; spread over two workers it starts twice, and interleaved
with other modules on one worker it is torn down and started again), unless the module marks its
module fixtures as cheap (`pytestmark = pytest.mark.spread`: say, a database of its own). The
other tests are handed out one by one, the long ones first (`heaviest_first`).

xdist's own `loadgroup` reads `xdist_group` marks through a suffix it writes into node ids, which
pytest 9.2 no longer takes (pytest-xdist issue 1386: the marks are silently ignored). So the
workers write the groups they computed to a file the controller names (`pytest_configure_node`),
and the controller's scheduler (xdist's `loadscope`, largest group first) reads them from there.
Explicit `xdist_group` marks count too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

GROUPS_KEY = "polar_mq_groups_dir"


def group_of(item: pytest.Item) -> str | None:
    """The group `item` must run in on one worker, or None when any worker may run it."""
    marks = sorted(str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                   for m in item.iter_markers("xdist_group"))  # fmt: skip
    if marks:
        return "_".join(marks)
    if item.get_closest_marker("vllm") is not None:
        return "vllm"
    if item.get_closest_marker("spread") is not None:
        return None
    info = getattr(item, "_fixtureinfo", None)
    chains = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope in ("module", "class", "package") for chain in chains for d in chain):
        return item.nodeid.split("::", 1)[0]
    return None


HEAVY_MARKS = ("e2e", "reliability", "slow", "benchmark")


def _weight(item: pytest.Item, group: str | None) -> int:
    """0: the real-vLLM group (a server start and minutes of tests on one worker); 1: a test that
    starts processes or stacks; 2: the rest (unit and API tests, mostly milliseconds)."""
    if group == "vllm":
        return 0
    heavy = any(item.get_closest_marker(m) is not None for m in HEAVY_MARKS)
    return 1 if heavy or "docker" in item.nodeid else 2


def heaviest_first(items: list[pytest.Item]) -> None:
    """Under xdist, order `items` (in place) so that the controller hands out the long groups and
    tests first and the many short ones last: the workers then finish together instead of one
    worker starting a minute-long test when the others are done. A group keeps its members
    together (its weight is its heaviest member's); the order is the same on every worker."""
    groups = {item.nodeid: group_of(item) or item.nodeid for item in items}
    weights: dict[str, int] = {}
    for item in items:
        group = groups[item.nodeid]
        weights[group] = min(weights.get(group, 2), _weight(item, group))
    items.sort(key=lambda item: weights[groups[item.nodeid]])


def record_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: write `{node id: group}` for the controller's scheduler."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if not workerinput or GROUPS_KEY not in workerinput:
        return
    groups = {item.nodeid: g for item in items if (g := group_of(item)) is not None}
    folder = Path(workerinput[GROUPS_KEY])
    part = folder / f".{workerinput['workerid']}.part"
    part.write_text(json.dumps(groups))
    part.replace(folder / f"{workerinput['workerid']}.json")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """On the controller: tell each worker where to write its groups."""
    config = node.config
    folder = getattr(config, "_polar_mq_groups_dir", None)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="polar-mq-xdist-")
        config._polar_mq_groups_dir = folder
    node.workerinput[GROUPS_KEY] = folder


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup`: xdist's per-scope scheduler over the groups the workers wrote."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # Hand the groups out in the workers' collection order (`heaviest_first`), not by size.
    config.option.loadscopereorder = False

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """A test's scope is its group, else the test itself."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has collected by now (`schedule`)
                self.groups = _read_groups(Path(config._polar_mq_groups_dir))
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def _read_groups(folder: Path) -> dict[str, str]:
    """The groups one worker wrote (every worker collects the same tests)."""
    for path in sorted(folder.glob("*.json")):
        groups: dict[str, str] = json.loads(path.read_text())
        return groups
    return {}


def pytest_unconfigure(config: pytest.Config) -> None:
    """On the controller: remove the groups' folder."""
    folder = getattr(config, "_polar_mq_groups_dir", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
