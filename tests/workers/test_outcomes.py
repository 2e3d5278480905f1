"""The typed stage outcomes commit what the stages committed as dicts: the same rollout columns,
row shapes and `finished` event detail, keys in the same order (the UI, the API, the metrics and
the benchmarks read them)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from polar_mq.evaluators import EvalResult
from polar_mq.lifecycle.transitions import RolloutRef
from polar_mq.trajectories.base import BuildResult, BuiltSample
from polar_mq.workers.stages.outcomes import (
    ARTIFACTS,
    EVALUATIONS,
    SAMPLES,
    AgentRan,
    Built,
    Evaluated,
    Prepared,
)

RID = uuid.uuid4()
AT = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
ROLLOUT = RolloutRef(RID, uuid.uuid4(), 1, 0, 0, 2, "n1", None, None, None)


def _same(got: dict[Any, Any], want: dict[Any, Any]) -> None:
    assert list(got.items()) == list(want.items())  # the keys' order too


def test_prepared_routes_the_next_stages_to_its_node() -> None:
    runtime = {"source": "cold", "warm": False, "start_s": 0.1, "recipe_s": 0.2}
    prepared = Prepared(node="n2", runtime_id="rt-1", runtime=runtime)
    assert prepared.next_node() == "n2"
    _same(prepared.columns(), {"node": "n2", "runtime_id": "rt-1"})
    assert prepared.rows() == {}
    _same(prepared.detail(), {"node": "n2", "runtime_id": "rt-1", "runtime": runtime})


def test_agent_ran_sets_its_three_columns_and_keeps_its_detail_keys() -> None:
    artifacts = [{"rollout_id": RID, "attempt": 2, "name": "agent.log"}]
    ran = AgentRan(
        termination_reason="completed", exit_code=0, error=None, timed_out=False,
        inactive=False, agent_s=1.5, setup_s=0.1, reap_s=0.01, flush_s=0.02, collect_s=0.03,
        proxy_written_total=4, calls_stored_by="receipts", calls_started=3, wakeups=1,
        agent_calls=3, auxiliary_calls=1, artifacts=artifacts, grading={"grading_s": 0.5},
    )  # fmt: skip
    assert ran.next_node() is None  # the rollout's own node
    _same(ran.columns(), {"termination_reason": "completed", "agent_exit_code": 0, "error": None})
    assert ran.rows() == {ARTIFACTS: artifacts}
    _same(
        ran.detail(),
        {
            "exit_code": 0, "timed_out": False, "inactive": False, "agent_s": 1.5,
            "setup_s": 0.1, "reap_s": 0.01, "flush_s": 0.02, "collect_s": 0.03,
            "proxy_written_total": 4, "calls_stored_by": "receipts", "calls_started": 3,
            "wakeups": 1, "agent_calls": 3, "auxiliary_calls": 1, "artifacts": ["agent.log"],
            "grading_s": 0.5,
        },
    )  # fmt: skip


def test_built_rows_are_the_samples_in_order() -> None:
    samples = [BuiltSample([1], [2], [1], [-0.5], None, {"turn": i}) for i in range(2)]
    built = Built(ROLLOUT, "per_call", 3, BuildResult(samples, {"samples": 2}), AT)
    _same(built.columns(), {"n_llm_calls": 3})
    (rows,) = built.rows().values()
    assert list(built.rows()) == [SAMPLES]
    for i, row in enumerate(rows):
        _same(
            row,
            {
                "rollout_id": RID, "attempt": 2, "sample_index": i, "builder": "per_call",
                "prompt_ids": [1], "response_ids": [2], "loss_mask": [1], "logprobs": [-0.5],
                "messages": None, "metadata": {"turn": i}, "created_at": AT,
            },
        )  # fmt: skip
    _same(built.detail(), {"builder": "per_call", "samples": 2})


def test_evaluated_records_its_evaluation_and_a_graded_diff() -> None:
    result = EvalResult(0.5, {"parts": []})
    plain = Evaluated(RID, 2, "weighted", result, "x" * 300, created_at=AT)
    _same(plain.columns(), {"reward": 0.5})
    evaluation = {
        "rollout_id": RID, "attempt": 2, "evaluator": "weighted", "reward": 0.5,
        "detail": {"parts": []}, "created_at": AT,
    }  # fmt: skip
    assert list(plain.rows()) == [EVALUATIONS]  # no artifact table without a graded diff
    _same(plain.rows()[EVALUATIONS][0], evaluation)
    _same(plain.detail(), {"reward": 0.5, "final_text": "x" * 200})
    diff = [{"rollout_id": RID, "attempt": 2, "name": "workspace.diff"}]
    graded = Evaluated(RID, 2, "tests", EvalResult(None), None, {"tampering": 1}, diff, AT)
    assert graded.rows()[ARTIFACTS] == diff
    _same(graded.detail(), {"reward": None, "final_text": "", "tampering": 1})
