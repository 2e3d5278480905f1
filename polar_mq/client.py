"""Python clients of the REST API, for trainers: `Client` (sync) and `AsyncClient`.

Only httpx (and rich for the progress bar) is needed on the trainer's side; responses are plain
dicts shaped as the OpenAPI schema documents them. Every error is a `PolarMQError` with the API's
status, type and message.

Submitting is safe to retry: a submission without an `idempotency_key` gets a fresh one, so a retry
after a dropped connection returns the job the first attempt created instead of a second job.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx
import orjson

DEFAULT_TIMEOUT_S = 30.0
TRANSIENT_STATUSES = frozenset({502, 503, 504})
SUBMIT_ATTEMPTS = 3
MAX_POLL_FAILURES = 10


class PolarMQError(Exception):
    """An error answer of the API (status 0: the server could not be reached)."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(f"{status} {type}: {message}")
        self.status = status
        self.type = type
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: the server was unreachable or briefly unavailable."""
        return self.status == 0 or self.status in TRANSIENT_STATUSES


@dataclass(frozen=True, slots=True)
class Submission:
    job_id: str
    rollout_ids: list[str]
    created: bool
    """False when the idempotency key named a job that already existed."""


# --------------------------------------------------------------------------------------------
# Shared by both clients: request shapes, response parsing, the group-following state


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": "polar-mq-client"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _submit_body(spec: Mapping[str, Any]) -> bytes:
    body = dict(spec)
    if not body.get("idempotency_key"):
        body["idempotency_key"] = f"client-{uuid.uuid4().hex}"
    return orjson.dumps(body)


def _parse(response: httpx.Response) -> Any:
    """The JSON body of a 2xx response, or the API's error raised as PolarMQError."""
    if response.is_success:
        return orjson.loads(response.content)
    try:
        error = orjson.loads(response.content)["error"]
        raise PolarMQError(response.status_code, str(error["type"]), str(error["message"]))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise PolarMQError(response.status_code, "http_error", response.text[:500]) from None


def _submission(data: Mapping[str, Any]) -> Submission:
    return Submission(str(data["job_id"]), [str(r) for r in data["rollout_ids"]], data["created"])


def _results_params(
    complete_only: bool, include_trajectories: bool, limit: int, cursor: str | None
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "complete_only": str(complete_only).lower(),
        "include_trajectories": str(include_trajectories).lower(),
        "limit": limit,
    }
    if cursor is not None:
        params["cursor"] = cursor
    return params


def _is_done(status: Mapping[str, Any]) -> bool:
    return status.get("state") != "running"


class _GroupFollower:
    """Which complete groups have been handed out, and where to poll next.

    The server lists a running job's groups in completion order and only once they are settled,
    so following the cursor sees each group once; the seen-set is a second guard. Polling stops
    after a drained page that says the job is finished (or cancelled).
    """

    def __init__(self) -> None:
        self.cursor: str | None = None
        self.seen: set[int] = set()
        self.done = False

    def accept(self, page: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        """(new groups, whether to fetch the next page at once instead of waiting)."""
        fresh = [g for g in page["groups"] if g["task_index"] not in self.seen]
        self.seen.update(g["task_index"] for g in fresh)
        if page["groups"]:
            self.cursor = page["groups"][-1]["cursor"]
        if page["next_cursor"] is not None:
            return fresh, True
        if page.get("job_finished") or page.get("job_state") == "cancelled":
            self.done = True
        return fresh, False


class _Deadline:
    def __init__(self, timeout: float | None) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout

    def check(self, what: str) -> None:
        if self.at is not None and time.monotonic() >= self.at:
            raise TimeoutError(f"{what} not finished after {self.timeout} s")


# --------------------------------------------------------------------------------------------
# Sync client


class Client:
    """Synchronous client: `Client("http://host:8000", api_key=...)`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=_headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise PolarMQError(0, "connection_error", f"{type(exc).__name__}: {exc}") from exc
        return _parse(response)

    # -- jobs

    def submit(
        self, tasks: Sequence[Mapping[str, Any]], samples_per_task: int = 1, **spec: Any
    ) -> Submission:
        """Submit tasks x samples_per_task rollouts; other JobCreate fields go in **spec."""
        return self.submit_spec(
            {"tasks": list(tasks), "samples_per_task": samples_per_task, **spec}
        )

    def submit_spec(self, spec: Mapping[str, Any]) -> Submission:
        """Submit a full job spec (the body of POST /v1/jobs); retried on transient failures."""
        body = _submit_body(spec)
        headers = {"Content-Type": "application/json"}
        for attempt in range(1, SUBMIT_ATTEMPTS + 1):
            try:
                return _submission(self._request("POST", "/v1/jobs", content=body, headers=headers))
            except PolarMQError as exc:
                if not exc.transient or attempt == SUBMIT_ATTEMPTS:
                    raise
                time.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    def status(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/jobs/{job_id}"))

    def jobs(self, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        """One page of jobs, newest first: {"jobs": [...], "next_cursor": ...}."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return dict(self._request("GET", "/v1/jobs", params=params))

    def wait(
        self,
        job_id: str,
        progress: bool = True,
        poll_s: float = 1.0,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Poll until every rollout is terminal (or the job is cancelled); the final status.

        Raises TimeoutError after `timeout` seconds. Brief outages of the API are ridden out.
        """
        deadline = _Deadline(timeout)
        if not progress:
            return self._poll_status(job_id, poll_s, deadline, lambda _s: None)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
        )  # fmt: skip
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task(f"job {job_id[:8]}", total=None, info="")

            def show(status: Mapping[str, Any]) -> None:
                bar.update(
                    task, total=status["total"], completed=status["terminal"], info=_info(status)
                )

            return self._poll_status(job_id, poll_s, deadline, show)

    def _poll_status(
        self,
        job_id: str,
        poll_s: float,
        deadline: _Deadline,
        show: Callable[[Mapping[str, Any]], None],
    ) -> dict[str, Any]:
        failures = 0
        while True:
            try:
                status = self.status(job_id)
                failures = 0
            except PolarMQError as exc:
                failures += 1
                if not exc.transient or failures >= MAX_POLL_FAILURES:
                    raise
            else:
                show(status)
                if _is_done(status):
                    return status
            deadline.check(f"job {job_id}")
            time.sleep(poll_s)

    def iter_results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
    ) -> Iterator[dict[str, Any]]:
        """Every group available now, page by page."""
        cursor: str | None = None
        while True:
            params = _results_params(complete_only, include_trajectories, page_size, cursor)
            page = self._request("GET", f"/v1/jobs/{job_id}/results", params=params)
            yield from page["groups"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
    ) -> list[dict[str, Any]]:
        """All groups available now (all pages): complete groups by default."""
        return list(self.iter_results(job_id, complete_only, include_trajectories, page_size))

    def iter_groups(
        self,
        job_id: str,
        include_trajectories: bool = False,
        poll_s: float = 1.0,
        timeout: float | None = None,
        page_size: int = 100,
    ) -> Iterator[dict[str, Any]]:
        """Yield each complete group once, as it completes, until the job is finished."""
        follower = _GroupFollower()
        deadline = _Deadline(timeout)
        while not follower.done:
            params = _results_params(True, include_trajectories, page_size, follower.cursor)
            page = self._request("GET", f"/v1/jobs/{job_id}/results", params=params)
            fresh, more = follower.accept(page)
            yield from fresh
            if not more and not follower.done:
                deadline.check(f"job {job_id}")
                time.sleep(poll_s)

    # -- rollouts

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        """Fields, events, stage timings, error and evaluation of one rollout."""
        return dict(self._request("GET", f"/v1/rollouts/{rollout_id}"))

    def trajectory(self, rollout_id: str) -> dict[str, Any]:
        """Training samples (token ids, loss mask, logprobs, messages) of one rollout."""
        return dict(self._request("GET", f"/v1/rollouts/{rollout_id}/trajectory"))

    def calls(self, rollout_id: str) -> list[dict[str, Any]]:
        """The LLM calls captured for one rollout, in order."""
        return list(self._request("GET", f"/v1/rollouts/{rollout_id}/calls")["calls"])

    # -- lifecycle

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _info(status: Mapping[str, Any]) -> str:
    failed = status["by_status"].get("failed", 0)
    reward = status.get("mean_reward")
    parts = [f"groups {status['groups_complete']}/{status['groups_total']}"]
    if failed:
        parts.append(f"[red]failed {failed}[/]")
    if reward is not None:
        parts.append(f"reward {reward:.3f}")
    return "  ".join(parts)


# --------------------------------------------------------------------------------------------
# Async client


class AsyncClient:
    """The same API for asyncio trainers: `async with AsyncClient(url) as client: ...`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=_headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise PolarMQError(0, "connection_error", f"{type(exc).__name__}: {exc}") from exc
        return _parse(response)

    async def submit(
        self, tasks: Sequence[Mapping[str, Any]], samples_per_task: int = 1, **spec: Any
    ) -> Submission:
        spec = {"tasks": list(tasks), "samples_per_task": samples_per_task, **spec}
        return await self.submit_spec(spec)

    async def submit_spec(self, spec: Mapping[str, Any]) -> Submission:
        body = _submit_body(spec)
        headers = {"Content-Type": "application/json"}
        for attempt in range(1, SUBMIT_ATTEMPTS + 1):
            try:
                data = await self._request("POST", "/v1/jobs", content=body, headers=headers)
                return _submission(data)
            except PolarMQError as exc:
                if not exc.transient or attempt == SUBMIT_ATTEMPTS:
                    raise
                await asyncio.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    async def status(self, job_id: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/v1/jobs/{job_id}"))

    async def wait(
        self, job_id: str, poll_s: float = 1.0, timeout: float | None = None
    ) -> dict[str, Any]:
        """Poll until every rollout is terminal (or the job is cancelled); the final status."""
        deadline = _Deadline(timeout)
        failures = 0
        while True:
            try:
                status = await self.status(job_id)
                failures = 0
                if _is_done(status):
                    return status
            except PolarMQError as exc:
                failures += 1
                if not exc.transient or failures >= MAX_POLL_FAILURES:
                    raise
            deadline.check(f"job {job_id}")
            await asyncio.sleep(poll_s)

    async def iter_results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
    ) -> AsyncIterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            params = _results_params(complete_only, include_trajectories, page_size, cursor)
            page = await self._request("GET", f"/v1/jobs/{job_id}/results", params=params)
            for group in page["groups"]:
                yield group
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
    ) -> list[dict[str, Any]]:
        pages = self.iter_results(job_id, complete_only, include_trajectories, page_size)
        return [group async for group in pages]

    async def iter_groups(
        self,
        job_id: str,
        include_trajectories: bool = False,
        poll_s: float = 1.0,
        timeout: float | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[dict[str, Any]]:
        follower = _GroupFollower()
        deadline = _Deadline(timeout)
        while not follower.done:
            params = _results_params(True, include_trajectories, page_size, follower.cursor)
            page = await self._request("GET", f"/v1/jobs/{job_id}/results", params=params)
            fresh, more = follower.accept(page)
            for group in fresh:
                yield group
            if not more and not follower.done:
                deadline.check(f"job {job_id}")
                await asyncio.sleep(poll_s)

    async def rollout(self, rollout_id: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/v1/rollouts/{rollout_id}"))

    async def trajectory(self, rollout_id: str) -> dict[str, Any]:
        return dict(await self._request("GET", f"/v1/rollouts/{rollout_id}/trajectory"))

    async def calls(self, rollout_id: str) -> list[dict[str, Any]]:
        data = await self._request("GET", f"/v1/rollouts/{rollout_id}/calls")
        return list(data["calls"])

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
