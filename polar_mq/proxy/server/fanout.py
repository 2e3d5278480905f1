"""Admin calls of a `--workers N` proxy reach every one of its processes.

An admin call (pause, resume, policy version, backend changes, flush) lands on whichever process
the kernel gave the connection to, but each process has its own backends, in-flight calls and
call writer. So the process that receives it applies it itself and forwards the same call, over
each sibling's private Unix socket (in the supervisor's 0700 run directory), to all the others,
and answers only once all of them have: a pause answers with the in-flight calls of the whole
proxy, a flush with every process's rows stored. A sibling that cannot be reached (it is being
restarted) makes the call fail with a 503: the caller retries, nothing is reported done that is
not.

Changes are appended to a journal in the run directory; a child the supervisor restarts replays
it before it serves, so it comes back paused, at the policy version, with the backends its
siblings have. Calls arriving on the control socket are marked local (`local_only`) and applied
by that process alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from polar_mq.infra.tls import client_ssl_context
from polar_mq.proxy.errors import openai_error, unauthorized
from polar_mq.proxy.server.auth import LOCAL_KEY, admin_allowed

if TYPE_CHECKING:
    from polar_mq.proxy.server.worker_slot import WorkerSlot

logger = logging.getLogger(__name__)

JSON = "application/json"
Handler = Callable[[Request], Awaitable[Response]]
Merge = Callable[[list[Any]], Any]


def local_only(app: ASGIApp) -> ASGIApp:
    """`app` for the control socket: every call it serves is applied by this process alone."""

    async def control(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, LOCAL_KEY: True}, receive, send)

    return control


class Siblings:
    """The other processes of this proxy, reached over their control sockets."""

    def __init__(self, slot: WorkerSlot) -> None:
        self.slot = slot
        self.clients = {
            index: httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(
                    uds=str(slot.control_socket(index)), verify=client_ssl_context()
                ),
                base_url="http://proxy-worker",
                timeout=httpx.Timeout(None, connect=5.0),
            )
            for index in range(slot.count)
            if index != slot.index
        }

    async def forward(self, request: Request, body: bytes) -> list[httpx.Response | BaseException]:
        headers = {k: v for k, v in request.headers.items() if k in ("authorization",)}
        headers["content-type"] = "application/json"
        url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        calls = [
            client.request(request.method, url, content=body, headers=headers)
            for client in self.clients.values()
        ]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    def record(self, request: Request, body: bytes) -> None:
        """Journal a change that every process applied (replayed by a restarted child)."""
        entry = {"path": request.url.path, "body": orjson.loads(body) if body.strip() else {}}
        with self.slot.journal.open("ab") as journal:
            journal.write(orjson.dumps(entry) + b"\n")

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()


def fanned_out(handler: Handler, merge: Merge, *, journal: bool) -> Handler:
    """`handler`, applied by every process of the proxy; their JSON answers `merge`d into one."""

    async def endpoint(request: Request) -> Response:
        state = request.app.state.proxy
        siblings: Siblings | None = state.siblings
        if siblings is None or request.scope.get(LOCAL_KEY):
            return await handler(request)
        if not admin_allowed(request, state.admin_token):
            return unauthorized("admin token required")
        body = await request.body()  # kept by the request: the handler reads it again
        own, others = await asyncio.gather(handler(request), siblings.forward(request, body))
        if own.status_code >= 300:
            return own
        answers = [orjson.loads(bytes(own.body))]
        for index, answer in zip(siblings.clients, others, strict=True):
            if isinstance(answer, BaseException):
                logger.warning("proxy worker %d missed an admin call: %r", index, answer)
                return openai_error(
                    503,
                    f"proxy worker {index} is unreachable ({type(answer).__name__}); retry",
                    "server_error",
                    "worker_unreachable",
                )
            if answer.status_code >= 300:
                return Response(answer.content, answer.status_code, media_type=JSON)
            answers.append(answer.json())
        if journal and request.method == "POST":
            siblings.record(request, body)
        return Response(orjson.dumps(merge(answers)), own.status_code, media_type=JSON)

    return endpoint


def first(answers: list[Any]) -> Any:
    return answers[0]


def summed(answers: list[dict[str, Any]], keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Numbers added up (counters of each process), booleans all true; `keep`: the first's."""
    merged = dict(answers[0])
    for key, value in merged.items():
        values = [a.get(key) for a in answers]
        if key in keep:
            continue
        if isinstance(value, bool):
            merged[key] = all(bool(v) for v in values)
        elif isinstance(value, int | float):
            merged[key] = sum(v for v in values if isinstance(v, int | float))
    return merged


def flushed(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Every process's rows are stored; `started_at` is the youngest process's start."""
    merged = summed(answers, frozenset({"started_at"}))
    merged["started_at"] = max(a["started_at"] for a in answers)
    return merged


def paused(answers: list[dict[str, Any]]) -> dict[str, Any]:
    return summed(answers)


BACKEND_SAME = frozenset({"weight", "policy_version", "url", "name"})


def pool_snapshots(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The backends as the whole proxy sees them: load and counters added up per backend."""
    merged = summed(answers, frozenset({"pause_max_wait_s"}))
    by_name: dict[str, list[dict[str, Any]]] = {}
    for answer in answers:
        for backend in answer["backends"]:
            by_name.setdefault(backend["name"], []).append(backend)
    merged["backends"] = [summed(views, BACKEND_SAME) for views in by_name.values()]
    merged["processes"] = len(answers)
    return merged


async def replay(app: ASGIApp, slot: WorkerSlot, routes: Mapping[str, Handler]) -> int:
    """Apply the journal's changes to this (restarted) process before it serves; how many."""
    if not slot.journal.exists():
        return 0
    applied = 0
    for line in slot.journal.read_bytes().splitlines():
        if not line.strip():
            continue
        entry = orjson.loads(line)
        handler = routes.get(entry["path"])
        if handler is None:
            continue
        body = orjson.dumps(entry["body"])
        scope: Scope = {
            "type": "http",
            "method": "POST",
            "path": entry["path"],
            "query_string": b"",
            "headers": [(b"content-type", b"application/json")],
            "app": app,
            LOCAL_KEY: True,
        }

        async def receive(body: bytes = body) -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        response = await handler(Request(scope, receive))
        if response.status_code >= 300:
            logger.warning("journal entry %s not replayed: %s", entry, bytes(response.body))
        applied += 1
    return applied
