"""The evaluator of a job is one explicit rule, and every task must carry what it reads.

Before this check a tasks file where only some tasks had an `answer` was silently scored by
`completed` (every finished rollout 1), and `exact_match` on tasks without answers scored every
rollout None while they ended "completed".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.tasks_file import load_job_file

REPO = Path(__file__).resolve().parents[2]
ASKED = {"instruction": "What is 6*7?", "answer": "42"}
BARE = {"instruction": "Say hi."}


def refusal(**job: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        JobCreate.model_validate(job)
    return str(caught.value)


def test_some_tasks_with_answers_and_no_evaluator_is_refused_naming_the_tasks() -> None:
    message = refusal(tasks=[ASKED, BARE, ASKED, BARE])
    assert "only some tasks have 'answer': tasks[1], tasks[3] (2 of 4 tasks) lack it" in message
    assert '"evaluator": "completed"' in message


def test_a_long_list_of_lacking_tasks_is_cut_short() -> None:
    message = refusal(tasks=[ASKED, *[BARE] * 12])
    assert "tasks[1], tasks[2], tasks[3], tasks[4], tasks[5] and 7 more (12 of 13 tasks)" in message


def test_every_task_with_an_answer_and_no_evaluator_is_exact_match() -> None:
    job = JobCreate.model_validate({"tasks": [ASKED, ASKED]})
    assert job.evaluator == "exact_match"
    assert job.stored_spec()["evaluator"] == "exact_match"


def test_no_task_with_an_answer_and_no_evaluator_is_completed() -> None:
    assert JobCreate.model_validate({"tasks": [BARE]}).stored_spec()["evaluator"] == "completed"


def test_a_named_evaluator_is_kept_even_for_a_mix() -> None:
    job = JobCreate.model_validate({"tasks": [ASKED, BARE], "evaluator": "completed"})
    assert job.evaluator == "completed"


@pytest.mark.parametrize(
    ("evaluator", "message"),
    [
        ("exact_match", "evaluator 'exact_match' reads each task's 'answer', which tasks[1]"),
        ({"name": "exact_match", "key": "gold"}, "reads each task's 'gold', which tasks[0], "),
        ("tests", "evaluator 'tests' reads each task's 'tests', which tasks[0], tasks[1]"),
        (
            {"name": "llm_judge", "prompt": "Grade {answer} against {reference}"},
            "evaluator 'llm_judge' reads each task's 'answer', which tasks[1]",
        ),
        (
            {"name": "llm_judge", "prompt": "{answer} vs {rubric}"},
            "reads each task's 'rubric', which tasks[0], tasks[1] (2 of 2 tasks) lack",
        ),
        (
            {"name": "weighted", "evaluators": [{"spec": "completed"}, {"spec": "exact_match"}]},
            "evaluator 'weighted' reads each task's 'answer', which tasks[1] (1 of 2 tasks)",
        ),
        (
            {"name": "gate", "gate": "completed", "then": "exact_match"},
            "evaluator 'gate' reads each task's 'answer'",
        ),
    ],
)
def test_an_evaluator_needing_a_field_some_tasks_lack_is_refused(
    evaluator: str | dict[str, Any], message: str
) -> None:
    assert message in refusal(tasks=[ASKED, BARE], evaluator=evaluator)


@pytest.mark.parametrize(
    "evaluator",
    ["completed", {"name": "regex", "pattern": "42"}, {"name": "llm_judge", "prompt": "{answer}"}],
)
def test_evaluators_that_read_no_task_field_accept_any_tasks(evaluator: Any) -> None:
    JobCreate.model_validate({"tasks": [BARE], "evaluator": evaluator})


@pytest.mark.parametrize(
    "name", ["tasks/math_small.jsonl", "tasks/text_small.yaml", "arithmetic.json"]
)
def test_shipped_examples_are_accepted_as_written_and_scored_by_answer(name: str) -> None:
    """Without forcing an evaluator: a file that names none gets exact_match by the rule."""
    job = JobCreate.model_validate(load_job_file(REPO / "examples" / name).spec())
    assert job.evaluator == "exact_match"
