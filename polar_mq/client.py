"""Python clients of the REST API, for trainers: `Client` (sync) and `AsyncClient`.

Only httpx (and rich for the progress bar) is needed on the trainer's side; responses are plain
dicts shaped as the OpenAPI schema documents them. Every error is a `PolarMQError` with the API's
status, type and message.

Submitting is safe to retry: a submission without an `idempotency_key` gets a fresh one, so a retry
after a dropped connection returns the job the first attempt created instead of a second job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from polar_mq.client_async import AsyncClient
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
    _info,
    _is_done,
    _parse,
    _results_params,
    _submission,
    _submit_body,
)

if TYPE_CHECKING:
    from polar_mq.export import ExportSummary

__all__ = ["AsyncClient", "Client", "PolarMQError", "Submission"]


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

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel every unfinished rollout of a job: {"cancelled": [...], "already_terminal": n}."""
        return dict(self._request("POST", f"/v1/jobs/{job_id}/cancel"))

    def cancel_rollout(self, rollout_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/v1/rollouts/{rollout_id}/cancel"))

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

    def iter_pages(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every results page available now (follows next_cursor until it is null)."""
        cursor: str | None = None
        while True:
            params = _results_params(
                complete_only, include_trajectories, page_size, cursor, advantages
            )
            page = self._request("GET", f"/v1/jobs/{job_id}/results", params=params)
            yield page
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def iter_results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every group available now, page by page.

        `advantages="grpo"` adds each usable sample's group-relative advantage.
        """
        for page in self.iter_pages(
            job_id, complete_only, include_trajectories, page_size, advantages
        ):
            yield from page["groups"]

    def results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> list[dict[str, Any]]:
        """All groups available now (all pages): complete groups by default."""
        return list(
            self.iter_results(job_id, complete_only, include_trajectories, page_size, advantages)
        )

    def iter_groups(
        self,
        job_id: str,
        include_trajectories: bool = False,
        poll_s: float = 1.0,
        timeout: float | None = None,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield each complete group once, as it completes, until the job is finished."""
        follower = _GroupFollower()
        deadline = _Deadline(timeout)
        while not follower.done:
            params = _results_params(
                True, include_trajectories, page_size, follower.cursor, advantages
            )
            page = self._request("GET", f"/v1/jobs/{job_id}/results", params=params)
            fresh, more = follower.accept(page)
            yield from fresh
            if not more and not follower.done:
                deadline.check(f"job {job_id}")
                time.sleep(poll_s)

    def export(
        self,
        job_id: str,
        path: str | os.PathLike[str],
        format: str | None = None,
        complete_only: bool = True,
        advantages: str | None = None,
        page_size: int = EXPORT_PAGE_SIZE,
    ) -> ExportSummary:
        """Write the job's training samples to `path` as jsonl or parquet (default: by suffix).

        One row per training sample (see `polar_mq.export`); streamed page by page. Exports the
        groups available now: `summary.job_finished` is False when the job was still running.
        """
        writer = _export_writer(job_id, path, format, advantages)
        with writer:
            for page in self.iter_pages(job_id, complete_only, True, page_size, advantages):
                writer.add_page(page)
            return writer.finish()

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
