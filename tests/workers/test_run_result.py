"""The runner's typed result reads as the text it replaced, so the task's state, its stored result
and the stage metrics' label are what they were when `run_stage` returned strings."""

from __future__ import annotations

import pytest

from polar_mq.lifecycle.recovery import Recovery
from polar_mq.observability.stage_metrics import outcome_of
from polar_mq.workers.run_result import RunKind, RunResult
from polar_mq.workers.tasks import StageNotFinished, StageRetried, raise_unless_finished

TEXTS = [
    (RunResult.done(), "done"),
    (RunResult.skipped("built"), "skipped:built"),
    (RunResult.skipped("stale_attempt"), "skipped:stale_attempt"),
    (RunResult.failed("builder_error"), "failed:builder_error"),
    (RunResult.retry(2), "retry:2"),
    (RunResult.restart(Recovery.REQUEUED), "restart:requeued"),
    (RunResult.lease_lost(), "lease_lost"),
]
"""Each result and the string `run_stage` returned for it before it was typed."""


@pytest.mark.parametrize(("result", "text"), TEXTS)
def test_a_result_reads_as_the_string_it_replaced(result: RunResult, text: str) -> None:
    assert str(result) == text
    assert f"{result}" == text  # log lines format it
    assert outcome_of(result) == result.kind.value == text.partition(":")[0]


@pytest.mark.parametrize("result", [RunResult.done(), RunResult.skipped("completed")])
def test_a_finished_or_skipped_run_is_a_successful_task_returning_its_text(
    result: RunResult,
) -> None:
    returned = raise_unless_finished(result)
    assert returned == str(result) and type(returned) is str  # the result backend stores text


@pytest.mark.parametrize(
    "result",
    [
        RunResult.failed("runtime_error"),
        RunResult.restart(Recovery.REQUEUED),
        RunResult.lease_lost(),
    ],
)
def test_a_run_that_did_not_finish_fails_the_task_with_its_text(result: RunResult) -> None:
    with pytest.raises(StageNotFinished) as raised:
        raise_unless_finished(result)
    assert raised.value.outcome == str(result) and raised.value.args == (str(result),)
    assert outcome_of(raised.value) == result.kind.value


def test_a_retried_run_is_a_retried_task() -> None:
    with pytest.raises(StageRetried) as raised:
        raise_unless_finished(RunResult.retry(3))
    assert raised.value.outcome == "retry:3"
    assert outcome_of(raised.value) == RunKind.RETRY


def test_the_table_covers_every_kind() -> None:
    """A new kind needs its row in `TEXTS`: its text is what logs, Flower and metrics show."""
    assert {result.kind for result, _ in TEXTS} == set(RunKind)
