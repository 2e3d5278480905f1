"""`AsyncClient`: the REST API for asyncio trainers (same methods as `Client`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from polar_mq.client_common import (
    DEFAULT_TIMEOUT_S,
    EXPORT_PAGE_SIZE,
    LOST_LEASE_WARNING,
    MAX_POLL_FAILURES,
    MIN_POLL_S,
    SUBMIT_ATTEMPTS,
    PolarMQError,
    Submission,
    _BatchFiller,
    _Deadline,
    _export_writer,
    _GroupFollower,
    _headers,
    _is_done,
    _lease_body,
    _lost_lease,
    _parse,
    _results_params,
    _retry_delay,
    _submission,
    _submit_body,
    default_consumer,
    delivery_ids,
)

if TYPE_CHECKING:
    from polar_mq.export import ExportSummary

log = logging.getLogger(__name__)


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
        self._timeout = timeout

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

    # -- streaming groups (leases and acknowledgements); see `Client` for the semantics

    async def policy(self) -> dict[str, Any]:
        return dict(await self._request("GET", "/v1/policy"))

    async def set_policy(
        self, version: int, pause: bool = False, drain_timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """As `Client.set_policy`."""
        body = {"version": version, "pause": pause, "drain_timeout_s": drain_timeout_s}
        timeout = self._timeout + (drain_timeout_s if pause else 0.0)
        return dict(await self._request("POST", "/v1/policy", json=body, timeout=timeout))

    async def resume_policy(self) -> dict[str, Any]:
        return dict(await self._request("POST", "/v1/policy/resume"))

    async def lease_groups(
        self,
        job_id: str,
        consumer: str,
        max_groups: int = 16,
        lease_s: float = 60.0,
        wait_s: float = 0.0,
        include_trajectories: bool = False,
        advantages: str | None = None,
    ) -> dict[str, Any]:
        body = _lease_body(consumer, max_groups, lease_s, wait_s, include_trajectories, advantages)
        path = f"/v1/jobs/{job_id}/groups/lease"
        return dict(await self._request("POST", path, json=body, timeout=self._timeout + wait_s))

    async def ack_groups(
        self, job_id: str, consumer: str, delivery_ids: Sequence[str]
    ) -> dict[str, Any]:
        body = {"consumer": consumer, "delivery_ids": list(delivery_ids)}
        return dict(await self._request("POST", f"/v1/jobs/{job_id}/groups/ack", json=body))

    async def extend_leases(
        self, job_id: str, consumer: str, delivery_ids: Sequence[str], lease_s: float = 60.0
    ) -> dict[str, Any]:
        body = {"consumer": consumer, "delivery_ids": list(delivery_ids), "lease_s": lease_s}
        return dict(await self._request("POST", f"/v1/jobs/{job_id}/groups/extend", json=body))

    async def stream_groups(
        self,
        job_id: str,
        batch_size: int = 16,
        consumer: str | None = None,
        lease_s: float = 60.0,
        ack: str = "auto",
        wait_s: float = 10.0,
        include_trajectories: bool = False,
        advantages: str | None = None,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Batches of complete groups in completion order until the job is done.

        `async for batch in client.stream_groups(job, batch_size=8): train(batch)`. With
        `ack="auto"` a batch is acknowledged when the next one is asked for (a crash while
        training on it means redelivery after `lease_s`); `ack="manual"` leaves it to
        `ack_groups(job_id, consumer, delivery_ids(batch))`.
        """
        filler = _BatchFiller(
            consumer or default_consumer(), batch_size, lease_s, wait_s, ack,
            include_trajectories, advantages,
        )  # fmt: skip
        while True:
            await self._extend_held(job_id, filler)
            lease = await self._retrying(
                lambda: self._request(
                    "POST",
                    f"/v1/jobs/{job_id}/groups/lease",
                    json=filler.lease_body(),
                    timeout=self._timeout + filler.wait_s,
                )
            )
            batch = filler.accept(lease)
            if batch is not None:
                yield batch
                if filler.auto_ack:
                    await self._ack_consumed(job_id, filler.consumer, delivery_ids(batch))
            elif filler.done:
                return
            elif not lease["groups"] and filler.wait_s < MIN_POLL_S:
                await asyncio.sleep(MIN_POLL_S)

    async def _retrying(self, call: Callable[[], Awaitable[Any]]) -> Any:
        failures = 0
        while True:
            try:
                return await call()
            except PolarMQError as exc:
                failures += 1
                await asyncio.sleep(_retry_delay(exc, failures))

    async def _extend_held(self, job_id: str, filler: _BatchFiller) -> None:
        held = filler.held_to_extend()
        if not held:
            return
        consumer, lease_s = filler.consumer, filler.lease_s
        try:
            await self._retrying(lambda: self.extend_leases(job_id, consumer, held, lease_s))
        except PolarMQError as exc:
            if not _lost_lease(exc):
                raise
            log.warning(LOST_LEASE_WARNING, ", ".join(held), exc.type)
        filler.extended()

    async def _ack_consumed(self, job_id: str, consumer: str, ids: Sequence[str]) -> None:
        try:
            await self._retrying(lambda: self.ack_groups(job_id, consumer, ids))
            return
        except PolarMQError as exc:
            if not _lost_lease(exc):
                raise
        for one in ids:
            try:
                await self._retrying(lambda: self.ack_groups(job_id, consumer, [one]))  # noqa: B023
            except PolarMQError as exc:
                if not _lost_lease(exc):
                    raise
                log.warning(LOST_LEASE_WARNING, one, exc.type)

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
