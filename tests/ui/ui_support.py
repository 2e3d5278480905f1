"""Helpers for the dashboard tests: sign in, submit a job as a tenant, read a page's text."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient


def sign_in(client: TestClient, key: str) -> None:
    """Sign in through the login form (the cookie lands in the client's jar)."""
    client.cookies.clear()
    answer = client.post("/ui/login", data={"api_key": key, "next": "/ui/"})
    assert answer.status_code == 303, answer.text
    assert client.cookies.get("polar_mq_ui_key") == key


def submit(
    client: TestClient, key: str, tasks: list[dict[str, object]], samples: int, **extra: object
) -> tuple[uuid.UUID, list[uuid.UUID]]:
    answer = client.post(
        "/v1/jobs",
        json={"tasks": tasks, "samples_per_task": samples, **extra},
        headers={"authorization": f"Bearer {key}"},
    )
    assert answer.status_code == 201, answer.text
    body = answer.json()
    return uuid.UUID(body["job_id"]), [uuid.UUID(r) for r in body["rollout_ids"]]
