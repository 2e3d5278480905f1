"""Bad input is a 4xx JSON error with a type and a readable message, and creates nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import RecordingPublisher, row_counts
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from tests.conftest import module_database

NOTHING = {"jobs": 0, "job_tasks": 0, "rollouts": 0, "events": 0}
GOOD_TASK = {"instruction": "do it"}


pg_url, pg_engine = module_database("polar_mq_api_errors")  # it counts every row


@pytest.fixture(autouse=True)
def _nothing_created(
    db_session_factory: sessionmaker[Session], publisher: RecordingPublisher
) -> Iterator[None]:
    yield
    assert row_counts(db_session_factory) == NOTHING
    assert publisher.messages == []


def _error(response: Any, status: int, type_: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == type_
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"tasks": [GOOD_TASK, {"answer": "4"}]},
            "tasks.1: needs a non-empty string 'instruction'",
        ),
        ({"tasks": [{"instruction": "  "}]}, "tasks.0: needs a non-empty string 'instruction'"),
        ({"tasks": []}, "tasks: List should have at least 1 item"),
        (
            {"tasks": [GOOD_TASK], "samples_per_task": 0},
            "samples_per_task: Input should be greater",
        ),
        (
            {"tasks": [GOOD_TASK], "harness": {"type": "nope"}},
            "harness: unknown harness type 'nope'",
        ),
        (
            {"tasks": [GOOD_TASK], "harness": {"type": "command", "command": "x", "version": "1"}},
            "harness: unknown key(s) 'version' in 'command' harness spec; allowed: ",
        ),
        (
            {"tasks": [GOOD_TASK], "harness": {"type": "aider", "auto_install": "yes"}},
            "harness.auto_install: Input should be a valid boolean",
        ),
        (
            {"tasks": [GOOD_TASK], "runtime": {"kind": "bwrap", "cpus": 2}},
            "runtime: runtime option cpus=2.0 needs kind docker",
        ),
        ({"tasks": [GOOD_TASK], "evaluator": "nope"}, "evaluator: unknown evaluator 'nope'"),
        ({"tasks": [GOOD_TASK], "builder": "nope"}, "builder: unknown builder 'nope'"),
        ({"tasks": [GOOD_TASK], "bogus": 1}, "bogus: unknown field"),
        ({"tasks": [GOOD_TASK], "timeouts": {"agent_s": -1}}, "timeouts.agent_s: Input should be"),
        (
            {"tasks": [GOOD_TASK], "runtime": {"reuse": True}},
            "runtime: runtime.reuse needs runtime.warm: true",
        ),
        ({"tasks": [GOOD_TASK], "runtime": {"warm": "yes"}}, "runtime.warm: Input should be a"),
        ({"tasks": [GOOD_TASK], "runtime": {"warm": True, "pool": 3}}, "runtime.pool: unknown"),
        ({"tasks": [GOOD_TASK], "priority": -1}, "priority: Input should be greater than or"),
        ({"tasks": [GOOD_TASK], "priority": 10}, "priority: Input should be less than or equal"),
        ({"tasks": [GOOD_TASK], "priority": "5"}, "priority: Input should be a valid integer"),
        ({"tasks": [GOOD_TASK], "priority": True}, "priority: Input should be a valid integer"),
        ({"tasks": [GOOD_TASK], "priority": 2.5}, "priority: Input should be a valid integer"),
        (
            {"tasks": [GOOD_TASK], "sampling": {"enforce": "always"}},
            "sampling: enforce: unknown mode 'always'",
        ),
        (
            {"tasks": [GOOD_TASK], "sampling": {"enforce": {"seed": "clamp"}}},
            "sampling: enforce: unknown field 'seed'",
        ),
        (
            {"tasks": [GOOD_TASK], "sampling": {"max_tokens": "512"}},
            "sampling: max_tokens: expected an integer to enforce",
        ),
        (
            {"tasks": [{**GOOD_TASK, "repo": {"path": "repos/calc"}}]},
            "tasks.0: repo.path must be an absolute path",
        ),
        (
            {"tasks": [{**GOOD_TASK, "repo": {"path": "/r", "commit": "-x"}}]},
            "tasks.0: repo.commit must be a sha, branch or tag name",
        ),
        (
            {"tasks": [{**GOOD_TASK, "tests": {"files": {"../x.py": ""}}}]},
            "tasks.0: tests.files key '../x.py' must be relative",
        ),
        ({"tasks": [GOOD_TASK], "evaluator": {"name": "tests", "score": "most"}}, "'score'"),
        ({}, "tasks: field required"),
        ([GOOD_TASK], "Input should be a valid dictionary"),
        (
            {"tasks": [{**GOOD_TASK, "answer": "4"}, GOOD_TASK]},
            "no evaluator named and only some tasks have 'answer': tasks[1] (1 of 2 tasks) lack",
        ),
        (
            {"tasks": [GOOD_TASK], "evaluator": "exact_match"},
            "evaluator 'exact_match' reads each task's 'answer', which tasks[0] (1 of 1 tasks)",
        ),
        (
            {"tasks": [GOOD_TASK], "sampling": {"temprature": 0.7}},
            "sampling: unknown key 'temprature' (did you mean 'temperature'?)",
        ),
    ],
)
def test_invalid_jobs_are_422_naming_the_field(
    client: TestClient, body: Any, expected: str
) -> None:
    response = client.post("/v1/jobs", json=body)
    message = _error(response, 422, "validation_error")
    assert expected in message
    details = response.json()["error"]["details"]
    assert details and all({"path", "message"} == set(d) for d in details)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"tasks": [{"instruction": "x", "v": NaN}]}', "tasks.0.v: NaN and infinite"),
        (b'{"tasks": [{"instruction": "x", "v": [1, -Infinity]}]}', "tasks.0.v.1: NaN"),
        (b'{"tasks": [{"instruction": "a\\u0000b"}]}', "tasks.0.instruction: NUL characters"),
        (b'{"tasks": [{"instruction": "\\ud800"}]}', "tasks.0.instruction: lone UTF-16"),
        (b'{"tasks": [{"instruction": "x"}], "idempotency_key": "k\\u0000"}', "idempotency_key:"),
    ],
)
def test_json_the_database_cannot_store_is_422(
    client: TestClient, content: bytes, expected: str
) -> None:
    response = client.post(
        "/v1/jobs", content=content, headers={"content-type": "application/json"}
    )
    assert expected in _error(response, 422, "validation_error")


def test_several_errors_are_all_reported(client: TestClient) -> None:
    body = {"tasks": [GOOD_TASK], "samples_per_task": 0, "extra": True}
    message = _error(client.post("/v1/jobs", json=body), 422, "validation_error")
    assert "samples_per_task:" in message and "extra: unknown field" in message


@pytest.mark.parametrize(
    ("content", "headers", "expected"),
    [
        (b'{"tasks": [', {"content-type": "application/json"}, "not valid JSON"),
        (b"tasks: []", {"content-type": "application/json"}, "not valid JSON"),
        (b'{"tasks": []}', {"content-type": "text/plain"}, "Content-Type: application/json"),
        (b'{"tasks": []}', {}, "Content-Type: application/json"),
        (b"", {"content-type": "application/json"}, "request body is required"),
    ],
)
def test_a_body_that_is_not_json_is_400(
    client: TestClient, content: bytes, headers: dict[str, str], expected: str
) -> None:
    response = client.post("/v1/jobs", content=content, headers=headers)
    assert expected in _error(response, 400, "invalid_json")


def test_a_body_over_the_limit_is_413_before_it_is_read(client: TestClient) -> None:
    huge = {"tasks": [{"instruction": "x" * 100_000}]}
    message = _error(client.post("/v1/jobs", json=huge), 413, "payload_too_large")
    assert "65536" in message


def test_a_streamed_body_is_cut_off_at_the_limit(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"tasks": [{"instruction": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}]}'

    response = client.post(
        "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in {k.lower() for k in response.request.headers}
    _error(response, 413, "payload_too_large")


def test_the_server_stops_reading_a_streamed_body_at_the_limit(app: FastAPI) -> None:
    """At the ASGI level: an endless chunked body is read only up to the limit, then refused."""
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/jobs", "raw_path": b"/v1/jobs", "root_path": "",
        "query_string": b"", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert pulled == 65  # 64 KiB allowed, the 65th chunk crossed the limit
    assert b"payload_too_large" in b"".join(m.get("body", b"") for m in sent[1:])


def test_unknown_route_and_method_are_json(client: TestClient) -> None:
    assert "GET /v1/nope" in _error(client.get("/v1/nope"), 404, "not_found")
    _error(client.delete("/v1/jobs"), 405, "method_not_allowed")


def test_an_unexpected_error_is_a_500_without_internals(app: FastAPI) -> None:
    @app.get("/v1/boom")
    def boom() -> None:
        raise RuntimeError("secret internal detail")

    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/v1/boom")
    message = _error(response, 500, "internal_error")
    assert "secret" not in response.text and "Traceback" not in response.text
    assert "server log" in message


def test_openapi_documents_every_route_and_the_error_shape(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for path in (
        "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/results", "/v1/rollouts/{rollout_id}",
        "/v1/rollouts/{rollout_id}/trajectory", "/v1/rollouts/{rollout_id}/calls",
        "/healthz", "/readyz",
    ):  # fmt: skip
        assert path in paths
    post = paths["/v1/jobs"]["post"]
    assert set(post["responses"]) >= {"200", "201", "400", "401", "409", "413", "422"}
    error_ref = "#/components/schemas/ErrorResponse"
    assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"] == error_ref
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    results = paths["/v1/jobs/{job_id}/results"]["get"]["responses"]["200"]
    assert results["content"]["application/json"]["schema"]["$ref"].endswith("/ResultsPage")
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
