"""The `tests` evaluator in a real local runtime: hidden tests written after the agent, pytest's
JUnit report scored all/fraction, reward files, the diff in the detail, and its failure modes."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar_mq.evaluators import (
    EvalContext,
    GradingUnavailable,
    TestsEvaluator,
    evaluate_safely,
    get_evaluator,
)
from polar_mq.runtimes import LocalRuntime
from polar_mq.runtimes.safe_files import UnsafePath
from polar_mq.swe.checkout import checkout_repo
from polar_mq.swe.spec import parse_repo
from tests.conftest import runtime_id

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
HIDDEN = (
    "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 2) == 4\n\n\n"
    "def test_add_zero():\n    assert add(3, 0) == 3\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n"
)
NAMES = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_add_zero"]


@pytest.fixture()
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    source = tmp_path / "calc_repo"
    source.mkdir()
    (source / "calc.py").write_text(BUGGY)
    rt = LocalRuntime(runtime_id("tests-eval"), tmp_path / "runtimes")
    rt.start()
    rt.upload(b"{}", "task.json")
    checkout_repo(parse_repo({"path": str(source)}), rt.workdir)
    yield rt
    rt.stop()


def _ctx(rt: LocalRuntime, tests: dict[str, Any]) -> EvalContext:
    task = {"instruction": "fix add", "tests": tests}
    return EvalContext("r-1", task, rt, rt.workdir, 0, "completed", None)


def _fix(rt: LocalRuntime) -> None:
    (rt.workdir / "calc.py").write_text(BUGGY.replace("a - b", "a + b"))


def test_untouched_repo_scores_zero_and_a_fix_scores_one(runtime: LocalRuntime) -> None:
    evaluator = get_evaluator("tests")
    tests = {"files": {"tests/test_calc.py": HIDDEN}}
    before = evaluator.evaluate(_ctx(runtime, tests))
    assert before.reward == 0.0, before.detail
    assert before.detail["tests_failed"] == ["tests.test_calc::test_add"]
    assert before.detail["diff"] == "" and before.detail["diff_files"] == []
    _fix(runtime)
    shutil.rmtree(runtime.workdir / "tests")  # as in a fresh grading runtime
    after = evaluator.evaluate(_ctx(runtime, tests))
    assert after.reward == 1.0, after.detail
    assert after.detail["diff_files"] == ["calc.py"], "the hidden tests are not in the diff"
    assert "+    return a + b" in after.detail["diff"]
    assert after.detail["counts"] == {"passed": 3, "failed": 0, "skipped": 0, "missing": 0}


def test_fraction_of_named_tests(runtime: LocalRuntime) -> None:
    evaluator = get_evaluator({"name": "tests", "score": "fraction"})
    result = evaluator.evaluate(
        _ctx(runtime, {"files": {"tests/test_calc.py": HIDDEN}, "names": NAMES})
    )
    assert result.reward == pytest.approx(0.5)  # add(3, 0) passes even with the bug
    assert result.detail["tests_passed"] == [NAMES[1]]
    assert result.detail["tests_failed"] == [NAMES[0]]


def test_a_path_source_replaces_what_the_agent_put_there(
    runtime: LocalRuntime, tmp_path: Path
) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_calc.py").write_text(HIDDEN)
    tests_dir = runtime.workdir / "tests"
    tests_dir.mkdir()
    (tests_dir / "conftest.py").write_text(  # an agent that tries to pass every test
        "import pytest\n\n@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_runtest_call(item):\n    raise SystemExit\n"
    )
    result = get_evaluator("tests").evaluate(_ctx(runtime, {"path": str(hidden)}))
    assert result.reward == 0.0, result.detail
    assert not (tests_dir / "conftest.py").exists()


def test_reward_file_and_custom_command(runtime: LocalRuntime) -> None:
    tests = {
        "files": {"checks/run.sh": "grep -q 'a + b' calc.py && echo 0.75 > out/reward || true\n"},
        "command": "sh checks/run.sh",
        "reward_file": "out/reward",
    }
    assert get_evaluator("tests").evaluate(_ctx(runtime, tests)).reward == 0.0
    _fix(runtime)
    assert get_evaluator("tests").evaluate(_ctx(runtime, tests)).reward == pytest.approx(0.75)


def test_no_report_timeout_and_missing_tests(runtime: LocalRuntime, tmp_path: Path) -> None:
    no_report = get_evaluator({"name": "tests", "command": "true"})
    result = no_report.evaluate(_ctx(runtime, {"files": {"tests/test_calc.py": HIDDEN}}))
    assert result.reward == 0.0 and "junit_error" in result.detail
    slow = get_evaluator({"name": "tests", "command": "sleep 5", "timeout": 0.5})
    result = slow.evaluate(_ctx(runtime, {"files": {"tests/test_calc.py": HIDDEN}}))
    assert result.reward == 0.0 and result.detail["timed_out"] is True
    with pytest.raises(GradingUnavailable, match="is not a directory on this node"):
        get_evaluator("tests").evaluate(_ctx(runtime, {"path": str(tmp_path / "nope")}))
    no_tests = TestsEvaluator().evaluate(EvalContext("r", {}, runtime, None, 0, "completed", None))
    assert no_tests.reward is None


@pytest.mark.parametrize("target", ["/etc", "../home"])
def test_hidden_tests_never_follow_a_planted_link(
    runtime: LocalRuntime, tmp_path: Path, target: str
) -> None:
    """The hidden tests' directory swapped for a symlink (to /etc, or to a directory of the
    agent's): refused through every source, and evaluate_safely does not swallow it."""
    source = tmp_path / "hidden"
    source.mkdir()
    (source / "test_calc.py").write_text(HIDDEN)
    shutil.rmtree(runtime.workdir / "tests", ignore_errors=True)
    (runtime.workdir / "tests").symlink_to(target)
    evaluator = get_evaluator("tests")
    for tests in ({"files": {"tests/test_calc.py": HIDDEN}}, {"path": str(source)}):
        with pytest.raises(UnsafePath, match="tests is a symlink"):
            evaluate_safely(evaluator, _ctx(runtime, tests))
    assert not (runtime.path / "home" / "test_calc.py").exists()
    assert (runtime.workdir / "tests").is_symlink()  # left as the agent made it, for the record


def test_a_reward_file_link_is_never_followed(runtime: LocalRuntime) -> None:
    """A reward file planted as a link to a file of the agent's holding 1.0: refused, not read."""
    (runtime.path / "home" / "mine").write_text("1.0")
    (runtime.workdir / "reward.txt").symlink_to(runtime.path / "home" / "mine")
    evaluator = get_evaluator({"name": "tests", "command": "true", "reward_file": "reward.txt"})
    with pytest.raises(UnsafePath, match=r"reward\.txt is a symlink"):
        evaluator.evaluate(_ctx(runtime, {"files": {"tests/test_calc.py": HIDDEN}}))
    command = get_evaluator({"name": "command", "command": "true", "reward_file": "reward.txt"})
    with pytest.raises(UnsafePath, match=r"reward\.txt is a symlink"):
        evaluate_safely(command, _ctx(runtime, {}))
    assert (runtime.path / "home" / "mine").read_text() == "1.0"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "tests", "score": "most"}, "'score' must be one of all, fraction"),
        ({"name": "tests", "names": "tests/test_a.py::t"}, "non-empty list of test names"),
        ({"name": "tests", "reward_file": "/etc/passwd"}, "stay inside the workspace"),
        ({"name": "tests", "timeout": -1}, "positive number"),
        ({"name": "tests", "bogus": 1}, "bad parameters"),
        ({"name": "tests", "mode": "inplace"}, "'mode' must be one of diff, in_place"),
        ({"name": "tests", "plugins": ["-p x"]}, "plugin module names"),
        ({"name": "tests", "protected": ["../x"]}, "path patterns"),
    ],
)
def test_bad_evaluator_specs_are_value_errors(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_evaluator(spec)


SHADOW = (
    "import sys\nfor arg in sys.argv:\n    if arg.startswith('--junitxml='):\n"
    "        open(arg.split('=', 1)[1], 'w').write('<testsuite><testcase classname="
    '"tests.test_calc" name="test_add"/><testcase classname="tests.test_calc" '
    'name="test_add_zero"/></testsuite>\')\n'
)
PASS_ALL = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
    "    outcome.get_result().outcome = 'passed'\n"
)


def _plant_runner_cheats(rt: LocalRuntime) -> None:
    """What the diff filter drops anyway; here left in place to test the interpreter alone."""
    for name, text in {
        "pytest/__init__.py": "",
        "pytest/__main__.py": SHADOW,
        "cheatplug.py": PASS_ALL,
        "cheat-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: cheat\nVersion: 1.0\n",
        "cheat-1.0.dist-info/entry_points.txt": "[pytest11]\ncheat = cheatplug\n",
    }.items():
        rt.upload(text.encode(), name)


def test_graded_from_the_diff_the_workspace_cannot_steer_the_interpreter(
    runtime: LocalRuntime,
) -> None:
    """With `repo` (graded from the diff), pytest runs under `python -I` from the interpreter's
    site-packages, with plugin autoload off and an explicit config: a `pytest/` package and a
    `pytest11` entry point in the workspace do nothing. In place, the shadow wins."""
    _plant_runner_cheats(runtime)
    tests = {"files": {"tests/test_calc.py": HIDDEN}, "names": NAMES}
    task = {"instruction": "fix add", "tests": tests, "repo": {"path": "/unused"}}
    evaluator = get_evaluator({"name": "tests", "score": "fraction"})
    ctx = EvalContext("r-1", task, runtime, runtime.workdir, 0, "completed", None)
    graded = evaluator.evaluate(ctx)
    assert graded.reward == pytest.approx(0.5), graded.detail
    assert graded.detail["mode"] == "diff" and "diff" not in graded.detail
    in_place = get_evaluator({"name": "tests", "score": "fraction", "mode": "in_place"})
    shutil.rmtree(runtime.workdir / "tests")
    cheated = in_place.evaluate(ctx)
    assert cheated.reward == 1.0 and cheated.detail["mode"] == "in_place", cheated.detail


def test_the_grader_config_is_the_repositorys_own_or_an_empty_one(runtime: LocalRuntime) -> None:
    """`-c` names the repository's own configuration file (protected: as the commit has it), so
    its options apply; without one the grader's empty file stops pytest's search."""
    evaluator = get_evaluator({"name": "tests", "score": "fraction"})
    assert isinstance(evaluator, TestsEvaluator)
    tests = {"files": {"tests/test_calc.py": HIDDEN}, "names": NAMES}
    task = {"instruction": "fix add", "tests": tests, "repo": {"path": "/unused"}}
    ctx = EvalContext("r-1", task, runtime, runtime.workdir, 0, "completed", None)
    _fix(runtime)
    assert evaluator.evaluate(ctx).reward == 1.0
    runtime.upload(b"[pytest]\naddopts = -k test_add_zero\n", "tox.ini")
    narrowed = evaluator.evaluate(ctx)  # the repository's tox.ini applies: test_add deselected
    assert narrowed.reward == pytest.approx(0.5), narrowed.detail
    assert narrowed.detail["tests_missing"] == [NAMES[0]]
    patterns = evaluator.protected_patterns(task, str(runtime.workdir))
    assert "conftest.py" in patterns and "/tests/test_calc.py" in patterns


def test_the_evaluate_stage_finds_a_diff_graded_tests_evaluator_inside_composites() -> None:
    """A `gate` of tests then a judge, or tests as a weighted part, is graded from the diff too
    (every part then sees the pristine grading runtime); in place or without `repo` it is not."""
    from types import SimpleNamespace

    from polar_mq.spec import TaskInstance
    from polar_mq.workers.stages.evaluate import _diff_mode

    tests = {"tests": {"files": {"t.py": ""}}}
    repo_task = SimpleNamespace(instance=TaskInstance.of({"repo": {"path": "/r"}, **tests}))
    plain_task = SimpleNamespace(instance=TaskInstance.of(tests))
    gate = get_evaluator({"name": "gate", "gate": "tests", "then": "completed"})
    weighted = get_evaluator(
        {"name": "weighted", "evaluators": [{"spec": "completed", "weight": 0.5},
                                            {"spec": "tests", "weight": 0.5}]}
    )  # fmt: skip
    in_place = get_evaluator({"name": "gate", "gate": {"name": "tests", "mode": "in_place"},
                              "then": "completed"})  # fmt: skip
    assert isinstance(_diff_mode(gate, repo_task), TestsEvaluator)  # type: ignore[arg-type]
    assert isinstance(_diff_mode(weighted, repo_task), TestsEvaluator)  # type: ignore[arg-type]
    assert _diff_mode(in_place, repo_task) is None  # type: ignore[arg-type]
    assert _diff_mode(gate, plain_task) is None  # type: ignore[arg-type]
