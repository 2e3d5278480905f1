"""`AsyncClient`: the REST API for asyncio trainers (same methods as `Client`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from polar_mq.client_common import (
    DEFAULT_TIMEOUT_S,
    EXPORT_PAGE_SIZE,
    MAX_POLL_FAILURES,
    SUBMIT_ATTEMPTS,
    PolarMQError,
    Submission,
    _Deadline,
    _export_writer,
    _GroupFollower,
    _headers,
    _is_done,
    _parse,
    _results_params,
    _submission,
    _submit_body,
)

if TYPE_CHECKING:
    from polar_mq.export import ExportSummary


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

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel every unfinished rollout of a job: {"cancelled": [...], "already_terminal": n}."""
        return dict(await self._request("POST", f"/v1/jobs/{job_id}/cancel"))

    async def cancel_rollout(self, rollout_id: str) -> dict[str, Any]:
        return dict(await self._request("POST", f"/v1/rollouts/{rollout_id}/cancel"))

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

    async def iter_pages(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            params = _results_params(
                complete_only, include_trajectories, page_size, cursor, advantages
            )
            page = await self._request("GET", f"/v1/jobs/{job_id}/results", params=params)
            yield page
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def iter_results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        async for page in self.iter_pages(
            job_id, complete_only, include_trajectories, page_size, advantages
        ):
            for group in page["groups"]:
                yield group

    async def results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> list[dict[str, Any]]:
        pages = self.iter_results(
            job_id, complete_only, include_trajectories, page_size, advantages
        )
        return [group async for group in pages]

    async def iter_groups(
        self,
        job_id: str,
        include_trajectories: bool = False,
        poll_s: float = 1.0,
        timeout: float | None = None,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        follower = _GroupFollower()
        deadline = _Deadline(timeout)
        while not follower.done:
            params = _results_params(
                True, include_trajectories, page_size, follower.cursor, advantages
            )
            page = await self._request("GET", f"/v1/jobs/{job_id}/results", params=params)
            fresh, more = follower.accept(page)
            for group in fresh:
                yield group
            if not more and not follower.done:
                deadline.check(f"job {job_id}")
                await asyncio.sleep(poll_s)

    async def export(
        self,
        job_id: str,
        path: str | os.PathLike[str],
        format: str | None = None,
        complete_only: bool = True,
        advantages: str | None = None,
        page_size: int = EXPORT_PAGE_SIZE,
    ) -> ExportSummary:
        """As `Client.export` (file writes happen in the event loop's thread)."""
        writer = _export_writer(job_id, path, format, advantages)
        with writer:
            async for page in self.iter_pages(job_id, complete_only, True, page_size, advantages):
                writer.add_page(page)
            return writer.finish()

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
