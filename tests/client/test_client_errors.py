"""What a client's errors tell a newcomer: the URL it could not reach, where the key goes; and the
two faces offer the same operations, listed once (`client.operations`)."""

from __future__ import annotations

import asyncio
import inspect

import httpx
import pytest

from polar_mq.client import AsyncClient, Client, PolarMQError
from polar_mq.client.operations import Operation, Operations, StreamOperation
from polar_mq.infra.ports import free_port

UNAUTHORIZED = {"error": {"type": "unauthorized", "message": "missing API key"}}


def _answer(status: int, body: object, seen: list[httpx.Request]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler)


def test_an_unreachable_api_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PolarMQError) as caught:
        Client(url).status("j1")
    assert caught.value.status == 0
    assert caught.value.message.startswith(
        f"cannot reach the API at {url}/v1/jobs/j1 (ConnectError"
    )
    assert "`polar-mq up` starts one locally" in caught.value.message


def test_a_401_says_where_the_key_goes() -> None:
    seen: list[httpx.Request] = []
    client = Client("http://api", transport=_answer(401, UNAUTHORIZED, seen))
    with pytest.raises(PolarMQError) as caught:
        client.jobs()
    assert str(caught.value) == (
        "401 unauthorized: missing API key; pass api_key= (--api-key on the command line) or set "
        "POLAR_MQ_API_KEY"
    )


def test_the_key_comes_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []
    monkeypatch.setenv("POLAR_MQ_API_KEY", "pmq_from_env")
    Client("http://api", transport=_answer(200, {"jobs": []}, seen)).jobs()
    Client("http://api", "pmq_given", transport=_answer(200, {"jobs": []}, seen)).jobs()
    monkeypatch.setenv("POLAR_MQ_API_KEY", "")
    Client("http://api", transport=_answer(200, {"jobs": []}, seen)).jobs()
    assert [r.headers.get("authorization") for r in seen] == [
        "Bearer pmq_from_env", "Bearer pmq_given", None,
    ]  # fmt: skip


def test_both_faces_run_every_operation_listed_once() -> None:
    listed = {
        name for name, value in vars(Operations).items()
        if isinstance(value, Operation | StreamOperation)
    }  # fmt: skip
    assert {"submit", "status", "results", "iter_groups", "export", "stream_groups"} <= listed
    seen: list[httpx.Request] = []
    sync = Client("http://api", transport=_answer(200, {"job_id": "j1"}, seen))
    assert sync.status("j1") == {"job_id": "j1"}

    async def run() -> object:
        transport = _answer(200, {"job_id": "j2"}, seen)
        async with AsyncClient("http://api", transport=transport) as client:
            return await client.status("j2")

    assert asyncio.run(run()) == {"job_id": "j2"}
    assert [r.url.path for r in seen] == ["/v1/jobs/j1", "/v1/jobs/j2"]
    assert "Submit tasks" in (Client.submit.__doc__ or "")  # help() still shows the docs
    assert "job_id" in str(inspect.signature(sync.status))
