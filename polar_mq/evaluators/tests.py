"""`tests`: grade a software-engineering task by its hidden tests, with the diff as the artifact.

Two modes:
- `diff` (the default, for a task with a `repo`): the evaluate stage takes the agent's diff
  against the commit prepare recorded, stops the agent's runtime, and hands this evaluator a fresh
  runtime holding a pristine checkout plus the diff without test files and test configuration
  (`polar_mq.workers.stages.grading_runtime.diff_grading_runtime`). The tests then run with an
  interpreter the workspace cannot steer: `python -I` (no user site, no `PYTHON*` variables, no
  current directory on `sys.path`: a `pytest/` of the workspace cannot shadow the runner), pytest
  imported before the workspace is appended to `sys.path`, plugin autoload off, no
  `PYTEST_ADDOPTS`, and the configuration file chosen by the grader (`-c`: the pristine
  repository's own, which the agent cannot change, or an empty one). A task without `repo` has no
  pristine copy: it is graded in place.
- `in_place`: the old way, in the agent's own runtime (or a copy of its workspace with
  `runtime.evaluation`). Whatever the agent left there (a `conftest.py`, a plugin, a `.pth`, a
  daemon) can steer the result: unsafe for RL, kept for trusted agents and comparisons.

In the grading runtime, in this order:
1. (in place) the workspace diff against the checked-out commit is taken (before any test file is
   written, so the hidden tests never show up in it);
2. the task's hidden tests (`task.tests`) are written into the workspace;
3. the test command runs (default: pytest writing a JUnit report), and the reward is
   `all` — 1.0 when every test (or every named test) passed, else 0.0 — or
   `fraction` — the share of the (named) tests that passed;
   with a `reward_file` (Harbor's verifiers) the reward is the number that file holds instead.

Files the grader reads or writes in the workspace (the hidden tests' paths, the reward file, the
report) are never reached through a symlink: one planted there is `UnsafePath`, which the
evaluate stage scores 0 as the agent's doing. Hidden tests this node cannot read (`tests.path`
missing) are the platform's failure (`GradingUnavailable`: retried, never scored).

The job's evaluator spec sets defaults; a task's `tests` may override `command`, `names`,
`reward_file` and `timeout` (Harbor tasks bring their own command). A suite that timed out earns
0.0; one that produced no report earns 0.0 with the reason in the detail.
"""

from __future__ import annotations

import math
import re
import shlex
import uuid
from collections.abc import Mapping
from typing import Any

from polar_mq.evaluators.base import EvalContext, EvalResult, Evaluator, GradingUnavailable
from polar_mq.runtimes.base import ExecResult, Runtime
from polar_mq.runtimes.safe_files import UnsafePath
from polar_mq.swe import hidden_tests
from polar_mq.swe.diff import DEFAULT_MAX_CHARS, workspace_diff
from polar_mq.swe.junit import JUnitError, parse_junit, score_report
from polar_mq.swe.protect import DEFAULT_PROTECTED, hidden_test_patterns
from polar_mq.swe.spec import (
    TaskSpecError,
    TestsSpec,
    check_names,
    check_patterns,
    check_text,
    check_timeout,
    parse_tests,
    workspace_path,
)

DEFAULT_COMMAND = "{python} -m pytest -q -p no:cacheprovider --rootdir=. --junitxml={junit} {tests}"
ISOLATED_COMMAND = (
    "{python} -I -X pycache_prefix={pycache} -c {runner} {workspace} -q -p no:cacheprovider "
    "{plugins} -c {config} --rootdir={workspace} --junitxml={junit} {tests}"
)
"""Diff mode's default: pytest run by `RUNNER` under `python -I`."""
RUNNER = (
    "import sys; w = sys.argv.pop(1); import pytest; sys.path.append(w); "
    "sys.exit(pytest.main(sys.argv[1:]))"
)
"""pytest from the interpreter's own site-packages, imported before the workspace is on
`sys.path` (appended, so neither the runner nor the standard library can be shadowed by it)."""
ISOLATED_ENV = {
    "PYTHONNOUSERSITE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTEST_ADDOPTS": "",
    "PYTEST_PLUGINS": "",
    "PYTHONPATH": "",
}
"""For task commands that start Python otherwise than `ISOLATED_COMMAND` does."""
CONFIG_FILES = (
    ("pytest.ini", None),
    (".pytest.ini", None),
    ("pyproject.toml", "[tool.pytest"),
    ("tox.ini", "[pytest]"),
    ("setup.cfg", "[tool:pytest]"),
)
"""pytest's own search order at the rootdir (all protected: as pristine as the commit)."""
MODES = ("diff", "in_place")
SCORES = ("all", "fraction")
LIST_LIMIT = 1000
_PLUGIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,199}")
TAIL_CHARS = 2000


class TestsEvaluator(Evaluator):
    """Hidden tests → reward, see the module docstring. Placeholders in `command`: `{python}`
    (the runtime's interpreter), `{junit}` (the report path), `{tests}` (the hidden test paths),
    `{workspace}`, and as `ISOLATED_COMMAND` uses them `{runner}`, `{config}`, `{plugins}`
    (`-p NAME` for each of `plugins`: with autoload off, the pytest plugins a suite needs),
    `{pycache}`."""

    __test__ = False  # not a pytest test class, whatever its name
    name = "tests"
    needs_runtime = True
    needs_final_text = False

    def __init__(
        self,
        score: str = "all",
        names: list[str] | None = None,
        command: str | None = None,
        reward_file: str | None = None,
        timeout: float = 600.0,
        env: Mapping[str, str] | None = None,
        max_diff_chars: int = DEFAULT_MAX_CHARS,
        diff: bool = True,
        mode: str = "diff",
        protected: list[str] | None = None,
        plugins: list[str] | None = None,
    ) -> None:
        if score not in SCORES:
            raise ValueError(f"tests: 'score' must be one of {', '.join(SCORES)}, not {score!r}")
        if mode not in MODES:
            raise ValueError(f"tests: 'mode' must be one of {', '.join(MODES)}, not {mode!r}")
        if plugins is not None and not (
            isinstance(plugins, list)
            and all(isinstance(p, str) and _PLUGIN.fullmatch(p) for p in plugins)
        ):
            raise ValueError("tests: 'plugins' must be a list of plugin module names")
        try:
            self.names = check_names(names, "tests: 'names'")
            self.custom_command = check_text(command, "tests: 'command'")
            self.command = self.custom_command or DEFAULT_COMMAND
            self.protected = check_patterns(protected, "tests: 'protected'")
            self.reward_file = (
                None if reward_file is None else workspace_path(reward_file, "tests: 'reward_file'")
            )
            self.timeout = check_timeout(timeout, "tests: 'timeout'") or 600.0
        except TaskSpecError as exc:
            raise ValueError(str(exc)) from exc
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in dict(env).items()
        ):
            raise ValueError("tests: 'env' must map str to str")
        if isinstance(max_diff_chars, bool) or not isinstance(max_diff_chars, int):
            raise ValueError("tests: 'max_diff_chars' must be an int")
        self.score = score
        self.env = dict(env or {})
        self.max_diff_chars = max(0, max_diff_chars)
        self.diff = bool(diff)
        self.mode = mode
        self.plugins = tuple(plugins or ())

    def required_task_fields(self) -> frozenset[str]:
        return frozenset({"tests"})

    def grades_from_diff(self, task: Mapping[str, Any]) -> bool:
        """Whether this task is graded from the agent's diff on a pristine checkout."""
        return self.mode == "diff" and "repo" in task and "tests" in task

    def protected_patterns(self, task: Mapping[str, Any], workspace: str) -> list[str]:
        """What the grader drops from the agent's diff for `task`: the default, the hidden
        tests' places, the job's and the task's own patterns."""
        spec = parse_tests(task["tests"])
        files = hidden_tests.gather(spec, workspace)
        places = hidden_test_patterns(files, spec.dest, spec.path is not None)
        return [*DEFAULT_PROTECTED, *places, *self.protected, *spec.protected]

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        runtime = ctx.runtime
        if runtime is None:
            return EvalResult(None, {"error": "the tests evaluator needs the rollout's runtime"})
        if "tests" not in ctx.task:
            return EvalResult(None, {"error": "the task has no 'tests' (hidden tests) field"})
        spec = parse_tests(ctx.task["tests"])
        workspace = str(runtime.workdir)
        isolated = self.grades_from_diff(ctx.task)  # the stage records the diff itself
        detail: dict[str, Any] = {"mode": "diff" if isolated else "in_place"}
        if self.diff and not isolated:
            detail.update(workspace_diff(runtime.workdir, self.max_diff_chars).detail())
        try:
            files = hidden_tests.gather(spec, workspace)
            hidden_tests.install(runtime, spec, files, self.timeout)
        except hidden_tests.HiddenTestsError as exc:  # the grader's setup, not the agent's work
            raise GradingUnavailable(str(exc)) from exc
        reward_file = spec.reward_file or self.reward_file
        if reward_file is not None:  # emptied (never the agent's) and its directory made
            runtime.upload(b"", reward_file)
        junit = f".polar_mq-junit-{uuid.uuid4().hex}.xml"  # unguessable: the agent cannot plant it
        # bytecode of its own: a .pyc the agent's (or an earlier) run left for a source edited
        # within the same second at the same size would otherwise be reused
        pycache = f"{workspace}/.polar/pycache-{uuid.uuid4().hex}"
        config = _config_file(runtime) if isolated else None
        result = runtime.exec(
            self._command(spec, runtime, junit, files, isolated, config, pycache),
            env={
                **(ISOLATED_ENV if isolated else {}),
                **self.env,
                "POLAR_ROLLOUT_ID": ctx.rollout_id,
                "PYTHONPYCACHEPREFIX": pycache,
            },
            timeout=spec.timeout or self.timeout,
        )
        detail.update(_run_detail(result))
        if result.timed_out:  # a half-run suite earns nothing, whatever it reported
            return EvalResult(0.0, detail)
        if reward_file is not None:
            reward, error = _read_reward(runtime, reward_file)
            detail.update({"reward_file_error": error} if error else {})
            return EvalResult(reward, detail)
        return self._score_junit(runtime, junit, spec, detail)

    def _command(
        self,
        spec: TestsSpec,
        runtime: Runtime,
        junit: str,
        files: dict[str, bytes],
        isolated: bool = False,
        config: str | None = None,
        pycache: str = "",
    ) -> str:
        targets = [spec.dest] if spec.path is not None else sorted(files)
        values = {
            "{python}": shlex.quote(runtime.python),
            "{junit}": shlex.quote(junit),
            "{tests}": " ".join(shlex.quote(t) for t in targets),
            "{workspace}": shlex.quote(str(runtime.workdir)),
            "{runner}": shlex.quote(RUNNER),
            "{config}": shlex.quote(config or ""),
            "{plugins}": " ".join(f"-p {shlex.quote(p)}" for p in self.plugins),
            "{pycache}": shlex.quote(pycache),
        }
        default = ISOLATED_COMMAND if isolated else self.command
        command = spec.command or self.custom_command or default
        for placeholder, value in values.items():
            command = command.replace(placeholder, value)
        return command

    def _score_junit(
        self, runtime: Runtime, junit: str, spec: TestsSpec, detail: dict[str, Any]
    ) -> EvalResult:
        try:
            report = parse_junit(runtime.download(junit))
        except (OSError, JUnitError) as exc:
            return EvalResult(0.0, {**detail, "junit_error": f"{type(exc).__name__}: {exc}"})
        names = spec.names if spec.names is not None else self.names
        scored = score_report(report, self.score, names)
        detail.update(
            {
                "score": self.score,
                "tests_passed": scored.passed[:LIST_LIMIT],
                "tests_failed": scored.failed[:LIST_LIMIT],
                "tests_skipped": scored.skipped[:LIST_LIMIT],
                "tests_missing": scored.missing[:LIST_LIMIT],
                "counts": {
                    "passed": len(scored.passed),
                    "failed": len(scored.failed),
                    "skipped": len(scored.skipped),
                    "missing": len(scored.missing),
                },
            }
        )
        return EvalResult(scored.reward, detail)


def _config_file(runtime: Runtime) -> str:
    """The pristine repository's pytest configuration, or an empty one the grader writes (so
    pytest reads no other file: `-c` stops its search)."""
    for name, section in CONFIG_FILES:
        try:
            text = runtime.download(name).decode("utf-8", errors="replace")
        except (OSError, ValueError):
            continue  # absent (a link is absent too: the protected files are never links)
        if section is None or section in text:
            return name
    name = f".polar/pytest-grader-{uuid.uuid4().hex}.ini"
    runtime.upload(b"[pytest]\n", name)
    return name


def _run_detail(result: ExecResult) -> dict[str, Any]:
    return {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "duration_s": round(result.duration_s, 3),
        "stdout_tail": result.stdout_tail[-TAIL_CHARS:],
        "stderr_tail": result.stderr_tail[-TAIL_CHARS:],
    }


def _read_reward(runtime: Runtime, reward_file: str) -> tuple[float, str | None]:
    """The float the suite wrote; missing, empty or not a finite number → 0.0 with the reason."""
    try:
        raw = runtime.download(reward_file).decode("utf-8", errors="replace").strip()
        reward = float(raw)
    except UnsafePath:
        raise
    except (OSError, ValueError) as exc:
        return 0.0, f"{type(exc).__name__}: {exc}"
    if not math.isfinite(reward):
        return 0.0, f"reward is not finite: {raw!r}"
    return reward, None
