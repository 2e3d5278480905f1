"""pytest's JUnit XML report: which tests passed, failed or were skipped, by pytest node id.

pytest derives a testcase's `classname` and `name` from its node id (path relative to the
rootdir, `::`-separated), so both sides can be put in one canonical form: `tests/test_x.py::
TestA::test_b[1]` and `classname="tests.test_x.TestA" name="test_b[1]"` both become
`tests.test_x.TestA.test_b[1]`. Named tests may therefore be written either way.

The report is written by code the agent could have touched, so it is parsed defensively: a size
cap, the stdlib parser (expat refuses entity expansion attacks and never fetches external
entities), and anything malformed is an error for the caller to score, never an exception.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_REPORT_BYTES = 20 * 1024 * 1024
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
_RANK = {PASSED: 0, SKIPPED: 1, FAILED: 2}  # one test reported twice: the worst outcome wins


class JUnitError(ValueError):
    """The report is missing, too large or not JUnit XML."""


@dataclass(slots=True)
class JUnitReport:
    """Outcome per test, keyed by canonical name, plus the name as pytest showed it."""

    outcomes: dict[str, str] = field(default_factory=dict)
    shown: dict[str, str] = field(default_factory=dict)

    def names(self, outcome: str) -> list[str]:
        """Display names of the tests with `outcome`, in report order."""
        return [self.shown[key] for key, value in self.outcomes.items() if value == outcome]

    def count(self, outcome: str) -> int:
        return sum(1 for value in self.outcomes.values() if value == outcome)


def canonical(name: str) -> str:
    """One form for a node id (`a/b.py::C::t`) or a dotted JUnit name (`a.b.C.t`)."""
    name = name.strip()
    head, sep, params = name.partition("[")
    parts = head.split("::")
    path = parts[0].removeprefix("./")
    if path.endswith(".py"):
        path = path[: -len(".py")]
    dotted = ".".join([path.replace("/", "."), *parts[1:]])
    return dotted + sep + params


def parse_junit(data: bytes) -> JUnitReport:
    """Every testcase of the report with its outcome (failure or error → failed)."""
    if len(data) > MAX_REPORT_BYTES:
        raise JUnitError(f"JUnit report larger than {MAX_REPORT_BYTES} bytes")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise JUnitError(f"not valid XML: {exc}") from exc
    if root.tag not in ("testsuites", "testsuite"):
        raise JUnitError(f"not a JUnit report (root element <{root.tag}>)")
    report = JUnitReport()
    for case in root.iter("testcase"):
        classname = case.get("classname") or ""
        name = case.get("name") or ""
        shown = f"{classname}.{name}" if classname else name
        key = canonical(shown)
        outcome = _outcome(case)
        if _RANK[outcome] >= _RANK.get(report.outcomes.get(key, PASSED), 0):
            report.outcomes[key] = outcome
        report.shown.setdefault(key, _node_id(classname, name))
    return report


def _outcome(case: ET.Element) -> str:
    tags = {child.tag for child in case}
    if tags & {"failure", "error"}:
        return FAILED
    if "skipped" in tags:
        return SKIPPED
    return PASSED


def _node_id(classname: str, name: str) -> str:
    """A readable guess at the node id (the module/class split is not in the report)."""
    return f"{classname}::{name}" if classname else name


@dataclass(frozen=True, slots=True)
class Score:
    """A reward and the tests behind it."""

    reward: float
    passed: list[str]
    failed: list[str]
    skipped: list[str]
    missing: list[str]


def score_report(report: JUnitReport, mode: str, names: Iterable[str] | None) -> Score:
    """`all`: 1.0 when every (named) test passed, else 0.0; `fraction`: the share that passed.

    Named tests absent from the report count as failed (listed as `missing`). Without names,
    every test of the report counts, skipped ones excepted (`all` still needs one pass).
    """
    missing: list[str] = []
    if names is None:
        passed, failed, skipped = report.names(PASSED), report.names(FAILED), report.names(SKIPPED)
        total = len(passed) + len(failed)
    else:
        wanted = list(dict.fromkeys(names))
        passed, failed, skipped = [], [], []
        for name in wanted:
            outcome = report.outcomes.get(canonical(name))
            bucket = {PASSED: passed, FAILED: failed, SKIPPED: skipped, None: missing}[outcome]
            bucket.append(name)
        total = len(wanted)
    if mode == "fraction":
        reward = len(passed) / total if total else 0.0
    else:
        reward = 1.0 if passed and len(passed) == total else 0.0
    return Score(reward, passed, failed, skipped, missing)
