"""Which evaluator scores a job, and whether its tasks carry what that evaluator reads.

A reward must never change meaning silently. Two ways it used to: a tasks file where only some
tasks had an `answer` got the `completed` evaluator (every finished rollout scored 1), and
`exact_match` on tasks without answers scored every rollout None while the rollouts ended
"completed". So the default is one explicit rule, the same for the API, the Python client and
the CLI, and every task is checked against the fields the evaluator declares
(`Evaluator.required_task_fields`) at submit:

- the job names an evaluator: it is used, and every task must carry the fields it reads;
- it names none: every task has an `answer` -> `exact_match`; else every task has hidden `tests`
  -> `tests`; no task has either -> `completed`; a mix -> refused, naming the tasks that lack the
  field and how to choose.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polar_mq.evaluators.base import Evaluator

ANSWER, TESTS = "answer", "tests"
DEFAULT_BY_FIELD = ((ANSWER, "exact_match"), (TESTS, "tests"))
"""The default evaluator when every task has the field, in order of precedence."""
FALLBACK = "completed"
"""The default when no task has any of those fields: reward finishing cleanly."""
LISTED = 5
"""How many task indices a message names before "and N more"."""
HOW_TO_CHOOSE = (
    'name the evaluator: "evaluator": "completed" rewards any cleanly finished rollout, '
    '"exact_match" compares the answer with each task\'s "answer" (docs/evaluators.md)'
)


def default_evaluator(tasks: Sequence[Mapping[str, Any]]) -> str:
    """The evaluator of a job that names none (see the module docstring); ValueError on a mix."""
    for field, name in DEFAULT_BY_FIELD:
        if all(field in task for task in tasks):
            return name
    for field, name in DEFAULT_BY_FIELD:
        lacking = [i for i, task in enumerate(tasks) if field not in task]
        if len(lacking) < len(tasks):
            raise ValueError(
                f"no evaluator named and only some tasks have {field!r}: "
                f"{_tasks(lacking, len(tasks))} lack it, so neither {name!r} (which needs it on "
                f"every task) nor {FALLBACK!r} (which ignores it) can be picked for you; add "
                f"{field!r} to every task, or {HOW_TO_CHOOSE}"
            )
    return FALLBACK


def task_fields_problem(
    evaluator: Evaluator, label: str, tasks: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why `evaluator` (named `label`) cannot score every one of `tasks`, or None."""
    for field in sorted(evaluator.required_task_fields()):
        lacking = [i for i, task in enumerate(tasks) if field not in task]
        if lacking:
            return (
                f"evaluator {label!r} reads each task's {field!r}, which "
                f"{_tasks(lacking, len(tasks))} lack: every rollout of those tasks would end "
                f"unscored; add {field!r} to every task, or choose another evaluator "
                "(docs/evaluators.md)"
            )
    return None


def evaluator_label(spec: str | Mapping[str, Any]) -> str:
    """The name an evaluator spec is known by in messages."""
    return spec if isinstance(spec, str) else str(spec.get("name", "?"))


def _tasks(indices: list[int], total: int) -> str:
    """`tasks[1], tasks[4] (2 of 10 tasks)`, at most `LISTED` indices named."""
    named = ", ".join(f"tasks[{i}]" for i in indices[:LISTED])
    more = f" and {len(indices) - LISTED} more" if len(indices) > LISTED else ""
    return f"{named}{more} ({len(indices)} of {total} tasks)"
