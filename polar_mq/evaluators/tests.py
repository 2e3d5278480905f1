"""`tests`: grade a software-engineering task by its hidden tests, with the diff as the artifact.

In the grading runtime (the agent's own after it exited, or the fresh one of
`runtime.evaluation`, already holding a copy of the agent's workspace), in this order:
1. the workspace diff against the checked-out commit is taken (before any test file is written,
   so the hidden tests never show up in it);
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
from polar_mq.swe.spec import (
    TaskSpecError,
    TestsSpec,
    check_names,
    check_text,
    check_timeout,
    parse_tests,
    workspace_path,
)

DEFAULT_COMMAND = "{python} -m pytest -q -p no:cacheprovider --rootdir=. --junitxml={junit} {tests}"
SCORES = ("all", "fraction")
LIST_LIMIT = 1000
TAIL_CHARS = 2000


class TestsEvaluator(Evaluator):
    """Hidden tests → reward, see the module docstring. Placeholders in `command`: `{python}`
    (the runtime's interpreter), `{junit}` (the report path), `{tests}` (the hidden test paths),
    `{workspace}`."""

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
    ) -> None:
        if score not in SCORES:
            raise ValueError(f"tests: 'score' must be one of {', '.join(SCORES)}, not {score!r}")
        try:
            self.names = check_names(names, "tests: 'names'")
            self.command = check_text(command, "tests: 'command'") or DEFAULT_COMMAND
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

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        runtime = ctx.runtime
        if runtime is None:
            return EvalResult(None, {"error": "the tests evaluator needs the rollout's runtime"})
        if "tests" not in ctx.task:
            return EvalResult(None, {"error": "the task has no 'tests' (hidden tests) field"})
        spec = parse_tests(ctx.task["tests"])
        workspace = str(runtime.workdir)
        detail: dict[str, Any] = {}
        if self.diff:
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
        result = runtime.exec(
            self._command(spec, runtime, junit, files),
            env={
                **self.env,
                "POLAR_ROLLOUT_ID": ctx.rollout_id,
                # bytecode of its own: a .pyc the agent's (or an earlier) run left for a source
                # edited within the same second at the same size would otherwise be reused
                "PYTHONPYCACHEPREFIX": f"{workspace}/.polar/pycache-{uuid.uuid4().hex}",
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
        self, spec: TestsSpec, runtime: Runtime, junit: str, files: dict[str, bytes]
    ) -> str:
        targets = [spec.dest] if spec.path is not None else sorted(files)
        values = {
            "{python}": shlex.quote(runtime.python),
            "{junit}": shlex.quote(junit),
            "{tests}": " ".join(shlex.quote(t) for t in targets),
            "{workspace}": shlex.quote(str(runtime.workdir)),
        }
        command = spec.command or self.command
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
