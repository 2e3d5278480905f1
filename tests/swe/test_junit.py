"""pytest JUnit reports: parsing, canonical names, and the all / fraction scores."""

from __future__ import annotations

import pytest

from polar_mq.swe.junit import JUnitError, canonical, parse_junit, score_report

REPORT = b"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="6">
  <testcase classname="tests.test_calc" name="test_add" time="0.001"/>
  <testcase classname="tests.test_calc" name="test_sub" time="0.001">
    <failure message="assert 1 == 2">trace</failure></testcase>
  <testcase classname="tests.test_calc.TestDiv" name="test_div[2-1]" time="0.001"/>
  <testcase classname="tests.test_calc" name="test_skip" time="0"><skipped message="no"/></testcase>
  <testcase classname="tests.test_calc" name="test_teardown" time="0.001"/>
  <testcase classname="tests.test_calc" name="test_teardown" time="0.001">
    <error message="teardown failed"/></testcase>
</testsuite></testsuites>"""


def test_canonical_names_match_node_ids_and_junit_names() -> None:
    assert canonical("tests/test_calc.py::TestDiv::test_div[2-1]") == canonical(
        "tests.test_calc.TestDiv.test_div[2-1]"
    )
    assert canonical("./tests/test_calc.py::test_add") == "tests.test_calc.test_add"
    assert canonical("tests/test_x.py::test_a[a/b.py]") == "tests.test_x.test_a[a/b.py]"


def test_parse_outcomes_worst_wins_for_a_test_reported_twice() -> None:
    report = parse_junit(REPORT)
    assert report.names("passed") == [
        "tests.test_calc::test_add",
        "tests.test_calc.TestDiv::test_div[2-1]",
    ]
    assert report.names("failed") == ["tests.test_calc::test_sub", "tests.test_calc::test_teardown"]
    assert report.names("skipped") == ["tests.test_calc::test_skip"]


def test_a_bare_testsuite_root_is_accepted() -> None:
    report = parse_junit(b'<testsuite><testcase classname="t" name="a"/></testsuite>')
    assert report.count("passed") == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not xml", "not valid XML"),
        (b"<html/>", "not a JUnit report"),
        (
            b"<!DOCTYPE x [<!ENTITY e SYSTEM 'file:///etc/passwd'>]><testsuite>&e;</testsuite>",
            "XML",
        ),
    ],
)
def test_bad_reports_are_errors(data: bytes, message: str) -> None:
    with pytest.raises(JUnitError, match=message):
        parse_junit(data)


def test_all_needs_every_test_to_pass_skips_aside() -> None:
    report = parse_junit(REPORT)
    assert score_report(report, "all", None).reward == 0.0
    named = ["tests/test_calc.py::test_add", "tests/test_calc.py::TestDiv::test_div[2-1]"]
    assert score_report(report, "all", named).reward == 1.0
    only_skip = parse_junit(b'<testsuite><testcase classname="t" name="s"><skipped/></testcase>'
                            b"</testsuite>")  # fmt: skip
    assert score_report(only_skip, "all", None).reward == 0.0, "nothing passed"


def test_fraction_of_named_tests_with_missing_ones_failing() -> None:
    report = parse_junit(REPORT)
    named = [
        "tests/test_calc.py::test_add",
        "tests/test_calc.py::test_sub",
        "tests/test_calc.py::test_skip",
        "tests/test_calc.py::test_never_ran",
    ]
    scored = score_report(report, "fraction", named)
    assert scored.reward == pytest.approx(0.25)
    assert scored.passed == ["tests/test_calc.py::test_add"]
    assert scored.failed == ["tests/test_calc.py::test_sub"]
    assert scored.skipped == ["tests/test_calc.py::test_skip"]
    assert scored.missing == ["tests/test_calc.py::test_never_ran"]


def test_fraction_without_names_counts_every_test_but_skips() -> None:
    scored = score_report(parse_junit(REPORT), "fraction", None)
    assert scored.reward == pytest.approx(2 / 4)
