"""The client core without a network: its operations driven step by step with scripted answers,
and the two faces (sync, async) over httpx.MockTransport giving the same results.

The live-API behaviour is in tests/test_client.py; here are the paths a live API rarely takes
(transient failures, lost leases, transport errors), which the core now owns once for both faces.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from polar_mq.client import AsyncClient, Client, PolarMQError
from polar_mq.client.core import ClientCore
from polar_mq.client.steps import Call, Emit, Sleep, Stepper

Answer = Any  # a decoded answer, or a PolarMQError to throw into the operation


@dataclass
class Trace:
    result: Any = None
    calls: list[Call] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)
    items: list[Any] = field(default_factory=list)


def drive(op: Generator[Any, Any, Any], answers: Sequence[Answer]) -> Trace:
    """Run `op` to its end, answering its calls in order from `answers`."""
    script = list(answers)
    trace = Trace()
    stepper = Stepper(op)
    while (step := stepper.next()) is not None:
        if isinstance(step, Emit):
            trace.items.append(step.item)
        elif isinstance(step, Sleep):
            trace.sleeps.append(step.seconds)
        else:
            trace.calls.append(step)
            answer = script.pop(0)
            if isinstance(answer, PolarMQError):
                stepper.fail(answer)
            else:
                stepper.reply(answer)
    trace.result = stepper.result
    assert script == [], "the operation stopped before using every answer"
    return trace


def unavailable() -> PolarMQError:
    return PolarMQError(503, "broker_unavailable", "try again")


SUBMITTED = {"job_id": "j1", "rollout_ids": ["r1", "r2"], "created": True}


def test_submit_retries_transient_errors_with_one_idempotency_key() -> None:
    trace = drive(ClientCore().submit([{"instruction": "x"}], 2), [unavailable(), SUBMITTED])
    assert trace.result.job_id == "j1" and trace.result.rollout_ids == ["r1", "r2"]
    first, second = trace.calls
    assert first.content == second.content  # the same generated key: a retry finds the same job
    assert orjson.loads(first.content or b"")["idempotency_key"].startswith("client-")
    assert trace.sleeps == [0.5]


def test_submit_gives_up_at_once_on_a_refusal() -> None:
    refused = PolarMQError(422, "validation_error", "bad task")
    with pytest.raises(PolarMQError) as caught:
        drive(ClientCore().submit_spec({"tasks": []}), [refused])
    assert caught.value is refused


def test_wait_rides_out_an_outage_and_shows_each_status() -> None:
    running = {"state": "running", "total": 2, "terminal": 1}
    finished = {"state": "completed", "total": 2, "terminal": 2}
    shown: list[Any] = []
    op = ClientCore().wait("j1", poll_s=0.25, show=shown.append)
    trace = drive(op, [unavailable(), running, finished])
    assert trace.result == finished
    assert shown == [running, finished]
    assert trace.sleeps == [0.25, 0.25]


def _page(groups: list[int], next_cursor: str | None) -> dict[str, Any]:
    return {"groups": [{"task_index": i} for i in groups], "next_cursor": next_cursor}


def test_results_follow_the_cursor_through_every_page() -> None:
    pages = [_page([0, 1], "c1"), _page([2], None)]
    trace = drive(ClientCore().iter_results("j1", page_size=2), pages)
    assert [g["task_index"] for g in trace.items] == [0, 1, 2]
    assert [c.params and c.params.get("cursor") for c in trace.calls] == [None, "c1"]
    collected = drive(ClientCore().results("j1", page_size=2), pages)
    assert collected.items == [] and collected.result == trace.items


def _lease(groups: Sequence[str], *, finished: bool, done: bool) -> dict[str, Any]:
    return {
        "groups": [{"task_index": n, "delivery": {"delivery_id": d}} for n, d in enumerate(groups)],
        "job_finished": finished,
        "done": done,
    }


def test_stream_acks_each_batch_and_survives_a_lost_lease(caplog: pytest.LogCaptureFixture) -> None:
    lost = PolarMQError(409, "delivery_superseded", "leased again")
    answers = [
        _lease(["d1", "d2"], finished=True, done=False),
        lost,  # the batch ack: one of the two went to another consumer
        {"acked": 1},  # d1 alone
        lost,  # d2 alone
        _lease([], finished=True, done=True),
    ]
    op = ClientCore().stream_groups("j1", batch_size=2, consumer="c")
    with caplog.at_level(logging.WARNING, logger="polar_mq.client"):
        trace = drive(op, answers)
    assert [[g["delivery"]["delivery_id"] for g in batch] for batch in trace.items] == [
        ["d1", "d2"]
    ]
    acks = [c.json["delivery_ids"] for c in trace.calls if c.path.endswith("/ack")]
    assert acks == [["d1", "d2"], ["d1"], ["d2"]]
    assert "group delivery d2 could not be acknowledged" in caplog.text


def test_a_stream_left_early_closes_its_operation() -> None:
    closed: list[bool] = []

    def op() -> Generator[Any, Any, None]:
        try:
            yield Emit(1)
            yield Emit(2)
        finally:
            closed.append(True)

    client = Client("http://test", transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    iterator = client._drive(Stepper(op()))
    assert next(iterator) == 1
    iterator.close()
    assert closed == [True]


def _api(handler: Callable[[httpx.Request], httpx.Response]) -> tuple[Client, AsyncClient]:
    return (
        Client("http://test/", transport=httpx.MockTransport(handler)),
        AsyncClient("http://test/", transport=httpx.MockTransport(handler)),
    )


def test_both_faces_carry_out_the_same_operation() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/jobs/j1/results"
        cursor = request.url.params.get("cursor")
        page = _page([2], None) if cursor == "c1" else _page([0, 1], "c1")
        return httpx.Response(200, json=page)

    sync, async_ = _api(handler)
    with sync:
        from_sync = sync.results("j1", page_size=2)

    async def scenario() -> list[dict[str, Any]]:
        async with async_:
            return await async_.results("j1", page_size=2)

    assert from_sync == asyncio.run(scenario()) == _page([0, 1, 2], None)["groups"]


def test_both_faces_report_errors_and_unreachable_servers_alike() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/down"):
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(404, json={"error": {"type": "not_found", "message": "no job"}})

    sync, async_ = _api(handler)
    with pytest.raises(PolarMQError) as sync_error:
        sync.status("j1")

    async def scenario() -> PolarMQError:
        with pytest.raises(PolarMQError) as caught:
            await async_.status("j1")
        return caught.value

    async_error = asyncio.run(scenario())
    assert (sync_error.value.status, sync_error.value.type) == (404, "not_found")
    assert (async_error.status, async_error.type) == (404, "not_found")
    with pytest.raises(PolarMQError) as down:
        sync.rollout("down")
    assert down.value.status == 0 and down.value.transient


def test_async_export_saves_artifacts_inside_each_rollout_folder(tmp_path: Path) -> None:
    """The async face gets `export(..., artifacts_dir=...)` from the core, as the sync one has."""
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.url.path}?{request.url.query.decode()}")
        if request.url.path == "/v1/jobs/j1/results":
            group = {"group_id": "j1:0", "task_index": 0, "samples": [
                {"rollout_id": "r1", "attempt": 2, "trajectories": []},
            ]}  # fmt: skip
            return httpx.Response(
                200, json={"groups": [group], "next_cursor": None, "job_finished": True}
            )
        if request.url.path == "/v1/rollouts/r1/artifacts":
            names = [{"name": "agent.log"}, {"name": "../escape"}]
            return httpx.Response(200, json={"artifacts": names})
        return httpx.Response(200, content=b"log of r1")

    async def scenario() -> Any:
        async with AsyncClient("http://test", transport=httpx.MockTransport(handler)) as client:
            return await client.export(
                "j1", tmp_path / "out.jsonl", artifacts_dir=tmp_path / "artifacts"
            )

    summary = asyncio.run(scenario())
    assert (summary.groups, summary.rows, summary.artifacts) == (1, 0, 1)
    assert (tmp_path / "artifacts" / "r1" / "agent.log").read_bytes() == b"log of r1"
    assert not (tmp_path / "artifacts" / "escape").exists()
    assert "/v1/rollouts/r1/artifacts/agent.log?attempt=2" in asked
