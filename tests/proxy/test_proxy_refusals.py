"""Calls the proxy refuses or cannot serve: 401, 413, 400, 502 and the admin token."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import httpx
import pytest
from proxy_support import SECRET, Harness, proxy_settings, start_harness

from polar_mq.capability.tokens import InvalidToken, issue_rollout_token
from polar_mq.proxy.server import auth as auth_module
from polar_mq.proxy.server.auth import RolloutAuth
from polar_mq.testing.servers import free_port

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "What is 1 + 1?"}]}


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["code"] == code and error["message"]


def bad_tokens() -> dict[str, str]:
    rollout = uuid.uuid4()
    good = issue_rollout_token(SECRET, rollout, 600)
    return {
        "garbage": "sk-not-a-rollout-token",
        "forged": issue_rollout_token("another-secret", rollout, 600),
        "tampered": good[:-1] + ("0" if good[-1] != "0" else "1"),
        "expired": issue_rollout_token(SECRET, rollout, -5),
    }


@pytest.mark.parametrize("kind", ["garbage", "forged", "tampered", "expired"])
@pytest.mark.parametrize("where", ["bearer", "x-api-key", "path"])
async def test_invalid_token_is_refused_and_never_forwarded(
    harness: Harness, kind: str, where: str
) -> None:
    token = bad_tokens()[kind]
    path, headers = CHAT, {}
    if where == "bearer":
        headers = {"authorization": f"Bearer {token}"}
    elif where == "x-api-key":
        headers = {"x-api-key": token}
    else:
        path = f"/r/{token}{CHAT}"
    response = await harness.client.post(path, json=BODY, headers=headers)
    assert_openai_error(response, 401, "invalid_api_key")
    if kind == "expired":
        assert "expired" in response.json()["error"]["message"]
    assert harness.stats.requests == 0
    assert await harness.rows() == []


@pytest.mark.parametrize("path", [CHAT, "/v1/completions", "/v1/models"])
async def test_missing_token_is_refused(harness: Harness, path: str) -> None:
    if path == "/v1/models":
        response = await harness.client.get(path, headers={"authorization": "Basic abc"})
    else:
        response = await harness.client.post(path, json=BODY)
    assert_openai_error(response, 401, "invalid_api_key")
    assert "missing" in response.json()["error"]["message"]
    assert harness.stats.requests == 0 and not harness.stats.paths


async def test_first_valid_token_wins(harness: Harness) -> None:
    """A placeholder API key next to a valid path token (or the reverse) is fine."""
    by_path = await harness.client.post(
        f"/r/{harness.token}{CHAT}", json=BODY, headers={"authorization": "Bearer placeholder"}
    )
    by_key = await harness.client.post(
        CHAT, json=BODY, headers={"authorization": "Bearer placeholder", "x-api-key": harness.token}
    )
    assert by_path.status_code == by_key.status_code == 200
    assert [r["rollout_id"] for r in await harness.rows()] == [harness.rollout_id] * 2


def test_cached_token_still_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = RolloutAuth(SECRET)
    token = issue_rollout_token(SECRET, uuid.uuid4(), 60)
    claim = auth.verify(token)
    assert auth.verify(token) is claim  # served from the cache
    monkeypatch.setattr(auth_module, "time", SimpleNamespace(time=lambda: claim.expires_at + 1))
    with pytest.raises(InvalidToken, match="expired"):
        auth.verify(token)


async def test_oversized_body_with_content_length_is_refused_unread(harness: Harness) -> None:
    limit = harness.settings.max_body_bytes
    big = {**BODY, "padding": "x" * (limit + 1)}
    response = await harness.post(CHAT, big)
    assert_openai_error(response, 413, "request_too_large")
    assert harness.stats.requests == 0 and await harness.rows() == []


async def test_oversized_chunked_body_is_counted_while_reading(harness: Harness) -> None:
    limit = harness.settings.max_body_bytes
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"model": "m", "padding": "'
        while sent < 4 * limit:
            sent += 4096
            yield b"x" * 4096
        yield b'"}'

    response = await harness.client.post(CHAT, content=chunks(), headers=harness.auth)
    assert "content-length" not in response.request.headers
    assert_openai_error(response, 413, "request_too_large")
    assert harness.stats.requests == 0


async def test_body_just_under_the_limit_is_served(harness: Harness) -> None:
    body = {**BODY, "user": "x" * (harness.settings.max_body_bytes - 200)}
    assert (await harness.post(CHAT, body)).status_code == 200


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b'"text"'])
async def test_malformed_json_is_refused(harness: Harness, raw: bytes) -> None:
    response = await harness.client.post(
        CHAT, content=raw, headers={**harness.auth, "content-type": "application/json"}
    )
    assert_openai_error(response, 400, "invalid_json")
    assert harness.stats.requests == 0 and await harness.rows() == []


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_down_gives_502_and_is_logged(stream: bool) -> None:
    settings = proxy_settings(upstream_url=f"http://127.0.0.1:{free_port()}")
    async for h in start_harness(settings, use_transport=False):
        response = await h.post(CHAT, {**BODY, "stream": stream})
        assert_openai_error(response, 502, "bad_gateway")
        assert "127.0.0.1" not in response.text  # no internal addresses to the agent
        (row,) = await h.rows()
        assert (row["status_code"], row["complete"], row["stream"]) == (502, False, stream)
        assert row["backend"] == settings.upstream_url
        assert row["completion_ids"] is None and row["request"] == {**BODY, "stream": stream}


async def test_admin_flush_requires_the_admin_token() -> None:
    async for h in start_harness(proxy_settings(proxy_admin_token="admin-secret")):
        await h.post(CHAT, BODY)
        assert (await h.client.post("/admin/flush")).status_code == 401
        wrong = await h.client.post("/admin/flush", headers=h.auth)
        assert_openai_error(wrong, 401, "invalid_api_key")
        ok = await h.client.post("/admin/flush", headers={"authorization": "Bearer admin-secret"})
        assert ok.status_code == 200
        stats = ok.json()
        assert isinstance(stats.pop("started_at"), float)  # when the proxy started
        assert stats == {"written": 1, "dropped": 0, "failed": 0, "pending": 0}


async def test_admin_flush_open_without_admin_token(harness: Harness) -> None:
    await harness.post(CHAT, BODY)
    await harness.post(CHAT, {**BODY, "stream": True})
    assert (await harness.client.post("/admin/flush")).json()["written"] == 2
