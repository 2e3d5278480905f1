"""TaskInstance: the stages' typed, read-only view of a stored task (the stored form unchanged)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from polar_mq.spec.task import TaskInstance
from polar_mq.swe.spec import agent_task

STORED: dict[str, Any] = {
    "tests": {"files": {"test_a.py": "assert True"}},
    "instruction": "fix the bug",
    "grade": 7,
    "repo": {"path": "/srv/repo", "commit": "abc123"},
    "answer": ["42", 42],
    "metadata": {"source": "unit"},
}


def test_the_known_keys_are_attributes_and_the_rest_is_extra() -> None:
    task = TaskInstance.of(STORED)
    assert task.instruction == "fix the bug"
    assert task.answer == ["42", 42]
    assert task.repo == {"path": "/srv/repo", "commit": "abc123"}
    assert task.tests == {"files": {"test_a.py": "assert True"}}
    assert task.metadata == {"source": "unit"}
    assert task.reference is None
    assert task.extra == {"grade": 7}


def test_a_task_without_optional_keys_reads_none_and_empty() -> None:
    task = TaskInstance.of({"instruction": "hi"})
    assert (task.answer, task.reference, task.repo, task.tests) == (None, None, None, None)
    assert task.metadata == {} and task.extra == {}


def test_the_stored_form_comes_back_byte_for_byte() -> None:
    task = TaskInstance.of(STORED)
    assert orjson.dumps(task.as_dict()) == orjson.dumps(STORED)  # same keys, same order
    assert agent_task(task.stored, None) == agent_task(STORED, None)


def test_the_view_is_read_only_and_independent_of_its_source() -> None:
    source = {"instruction": "hi", "grade": 1}
    task = TaskInstance.of(source)
    source["grade"] = 2
    assert task.extra == {"grade": 1}
    with pytest.raises(TypeError):
        task.stored["grade"] = 3  # type: ignore[index]
    given = task.as_dict()
    given["grade"] = 4  # an evaluator's copy: the shared view is unchanged
    assert task.extra == {"grade": 1}


@pytest.mark.parametrize("stored", [{}, {"instruction": None}, {"instruction": 7}])
def test_a_row_without_a_string_instruction_fails_where_it_is_read(stored: dict[str, Any]) -> None:
    task = TaskInstance.of(stored)  # loading never fails: the claim must not
    with pytest.raises(ValueError, match="instruction"):
        _ = task.instruction
