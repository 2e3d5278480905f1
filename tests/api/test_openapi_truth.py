"""What schemathesis found (tests/api/test_schemathesis.py), pinned as fast, exact tests.

Each was a 5xx or an answer the OpenAPI schema did not declare: the `Allow` header of a 405, an
undecodable body, numbers JSONB stores but no reader can read back, forged cursors, loose policy
fields, and statuses (400, 408, 413) and the event stream's events missing from the schema.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from polar_mq.jobs.cursors import encode_cursor

TASK = {"instruction": "say hi"}


def _error(response: Any, status: int, type_: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["error"]["type"] == type_, response.text
    return str(response.json()["error"]["message"])


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/v1/jobs", "GET, POST"),
        ("DELETE", "/v1/jobs", "GET, POST"),
        ("PUT", "/v1/policy", "GET, POST"),
        ("GET", "/v1/policy/resume", "POST"),
    ],
)
def test_a_405_allows_every_method_of_the_path(
    client: TestClient, method: str, path: str, allow: str
) -> None:
    response = client.request(method, path)
    _error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == allow


def test_a_body_that_is_not_utf8_is_invalid_json(client: TestClient) -> None:
    response = client.post(
        "/v1/policy", content=b"#\xff4", headers={"content-type": "application/json"}
    )
    _error(response, 400, "invalid_json")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"tasks": [{"instruction": "x", "n": 99999999999999999999}]}', "tasks.0.n: integers"),
        (b'{"tasks": [{"instruction": "x"}], "metadata": {"n": -9223372036854775809}}', "64"),
        (b'{"tasks": [{"instruction": "x"}], "timeouts": {"rollout_s": 3.4e307}}', "2**63"),
    ],
)
def test_numbers_no_reader_can_read_back_are_422(
    client: TestClient, content: bytes, expected: str
) -> None:
    response = client.post(
        "/v1/jobs", content=content, headers={"content-type": "application/json"}
    )
    assert expected in _error(response, 422, "validation_error")


@pytest.mark.parametrize(
    "values",
    [
        ["2026-12-03T19:10:54.150467+00:00", 1],  # an int where the job id was: was a 500
        [1, "c464cabf-8c4f-4009-800f-76d2695e3aaa"],
        ["2026-12-03T19:10:54+00:00"],
    ],
)
def test_a_forged_cursor_is_400(client: TestClient, values: list[Any]) -> None:
    response = client.get("/v1/jobs", params={"cursor": encode_cursor(values)})
    _error(response, 400, "invalid_cursor")


@pytest.mark.parametrize(
    "body",
    [
        {"version": 1, "drain_timeout_s": False},
        {"version": True},
        {"version": "2"},
        {"version": 1, "pause": "yes"},
    ],
)
def test_policy_fields_are_strict(client: TestClient, body: dict[str, Any]) -> None:
    _error(client.post("/v1/policy", json=body), 422, "validation_error")


def test_every_operation_declares_the_middlewares_statuses(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert {"408", "413"} <= set(operation["responses"]), (method, path)
            if "requestBody" in operation:
                assert "400" in operation["responses"], (method, path)


def test_the_stream_declares_its_events(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    stream = schema["paths"]["/v1/jobs/{job_id}/groups/stream"]["get"]["responses"]["200"]
    events = stream["content"]["text/event-stream"]["schema"]["oneOf"]
    assert [e["properties"]["event"]["const"] for e in events] == ["group", "end"]
    assert events[0]["required"] == ["event", "data", "id"]
    tasks = schema["components"]["schemas"]["JobCreate"]["properties"]["tasks"]
    assert tasks["items"]["required"] == ["instruction"]
