"""Python clients of the REST API, for trainers: `Client` (sync) and `AsyncClient`.

Only httpx (and rich for the progress bar) is needed on the trainer's side; responses are plain
dicts shaped as the OpenAPI schema documents them. Every error is a `PolarMQError` with the API's
status, type and message.

Submitting is safe to retry: a submission without an `idempotency_key` gets a fresh one, so a retry
after a dropped connection returns the job the first attempt created instead of a second job.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from polar_mq.client_async import AsyncClient
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
    _info,
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
    page_rollouts,
)

if TYPE_CHECKING:
    from polar_mq.export import ExportSummary

__all__ = ["AsyncClient", "Client", "PolarMQError", "Submission", "delivery_ids"]
log = logging.getLogger(__name__)


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
        self._timeout = timeout

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
        artifacts_dir: str | os.PathLike[str] | None = None,
    ) -> ExportSummary:
        """Write the job's training samples to `path` as jsonl or parquet (default: by suffix).

        One row per training sample (see `polar_mq.export`); streamed page by page. Exports the
        groups available now: `summary.job_finished` is False when the job was still running.
        With `artifacts_dir`, each exported rollout's artifacts (agent log, transcript, diff) are
        saved as `artifacts_dir/<rollout id>/<name>` too.
        """
        writer = _export_writer(job_id, path, format, advantages)
        saved = 0
        with writer:
            for page in self.iter_pages(job_id, complete_only, True, page_size, advantages):
                writer.add_page(page)
                if artifacts_dir is not None:
                    for rollout_id, attempt in page_rollouts(page):
                        saved += self.save_artifacts(rollout_id, Path(artifacts_dir), attempt)
            summary = writer.finish()
        return dataclasses.replace(summary, artifacts=saved)

    # -- policy versions (weight updates)

    def policy(self) -> dict[str, Any]:
        """{"version", "paused", "updated_at"}: the trainer's current policy version."""
        return dict(self._request("GET", "/v1/policy"))

    def set_policy(
        self, version: int, pause: bool = False, drain_timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """Declare policy `version`. With `pause`, LLM calls are held and the ones in flight
        drained before this returns (load the weights, then call `resume_policy`)."""
        body = {"version": version, "pause": pause, "drain_timeout_s": drain_timeout_s}
        timeout = self._timeout + (drain_timeout_s if pause else 0.0)
        return dict(self._request("POST", "/v1/policy", json=body, timeout=timeout))

    def resume_policy(self) -> dict[str, Any]:
        """The new weights are loaded: held LLM calls go ahead on the current version."""
        return dict(self._request("POST", "/v1/policy/resume"))

    # -- streaming groups (leases and acknowledgements)

    def lease_groups(
        self,
        job_id: str,
        consumer: str,
        max_groups: int = 16,
        lease_s: float = 60.0,
        wait_s: float = 0.0,
        include_trajectories: bool = False,
        advantages: str | None = None,
    ) -> dict[str, Any]:
        """Lease complete groups in completion order, waiting up to `wait_s` for the first.

        Each group has a `delivery` (id, count, lease expiry); `done` says nothing is left.
        """
        body = _lease_body(consumer, max_groups, lease_s, wait_s, include_trajectories, advantages)
        path = f"/v1/jobs/{job_id}/groups/lease"
        return dict(self._request("POST", path, json=body, timeout=self._timeout + wait_s))

    def ack_groups(self, job_id: str, consumer: str, delivery_ids: Sequence[str]) -> dict[str, Any]:
        """Acknowledge deliveries: their groups are never handed out again (all or nothing)."""
        body = {"consumer": consumer, "delivery_ids": list(delivery_ids)}
        return dict(self._request("POST", f"/v1/jobs/{job_id}/groups/ack", json=body))

    def extend_leases(
        self, job_id: str, consumer: str, delivery_ids: Sequence[str], lease_s: float = 60.0
    ) -> dict[str, Any]:
        """Push the leases of unacked deliveries to now + lease_s."""
        body = {"consumer": consumer, "delivery_ids": list(delivery_ids), "lease_s": lease_s}
        return dict(self._request("POST", f"/v1/jobs/{job_id}/groups/extend", json=body))

    def stream_groups(
        self,
        job_id: str,
        batch_size: int = 16,
        consumer: str | None = None,
        lease_s: float = 60.0,
        ack: str = "auto",
        wait_s: float = 10.0,
        include_trajectories: bool = False,
        advantages: str | None = None,
    ) -> Iterator[list[dict[str, Any]]]:
        """Yield batches of complete groups, in completion order, until the job is done.

        Batches hold `batch_size` groups (the last ones may hold fewer). `ack="auto"`: a batch
        is acknowledged when you ask for the next one, so a crash while training on it means
        it is redelivered (to any consumer) after `lease_s`. `ack="manual"`: call
        `ack_groups(job_id, consumer, delivery_ids(batch))` yourself. Each group carries its
        `delivery` (`redelivered` is true when an earlier consumer did not ack it).
        """
        filler = _BatchFiller(
            consumer or default_consumer(), batch_size, lease_s, wait_s, ack,
            include_trajectories, advantages,
        )  # fmt: skip
        while True:
            self._extend_held(job_id, filler)
            lease = self._retrying(
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
                    self._ack_consumed(job_id, filler.consumer, delivery_ids(batch))
            elif filler.done:
                return
            elif not lease["groups"] and filler.wait_s < MIN_POLL_S:
                time.sleep(MIN_POLL_S)

    def _retrying(self, call: Callable[[], Any]) -> Any:
        failures = 0
        while True:
            try:
                return call()
            except PolarMQError as exc:
                failures += 1
                time.sleep(_retry_delay(exc, failures))

    def _extend_held(self, job_id: str, filler: _BatchFiller) -> None:
        held = filler.held_to_extend()
        if not held:
            return
        consumer, lease_s = filler.consumer, filler.lease_s
        try:
            self._retrying(lambda: self.extend_leases(job_id, consumer, held, lease_s))
        except PolarMQError as exc:
            if not _lost_lease(exc):
                raise
            log.warning(LOST_LEASE_WARNING, ", ".join(held), exc.type)
        filler.extended()

    def _ack_consumed(self, job_id: str, consumer: str, ids: Sequence[str]) -> None:
        """Ack a consumed batch; a delivery lost to another consumer is warned about, not fatal."""
        try:
            self._retrying(lambda: self.ack_groups(job_id, consumer, ids))
            return
        except PolarMQError as exc:
            if not _lost_lease(exc):
                raise
        for one in ids:
            try:
                self._retrying(lambda: self.ack_groups(job_id, consumer, [one]))  # noqa: B023
            except PolarMQError as exc:
                if not _lost_lease(exc):
                    raise
                log.warning(LOST_LEASE_WARNING, one, exc.type)

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

    def artifacts(self, rollout_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """Name, size, media type and `truncated` of each artifact of an attempt (default:
        the current one): agent.log, the harness's transcripts, workspace.diff."""
        params = {} if attempt is None else {"attempt": attempt}
        path = f"/v1/rollouts/{rollout_id}/artifacts"
        return list(self._request("GET", path, params=params)["artifacts"])

    def artifact(self, rollout_id: str, name: str, attempt: int | None = None) -> bytes:
        """One artifact's stored content."""
        params = {} if attempt is None else {"attempt": attempt}
        path = f"/v1/rollouts/{rollout_id}/artifacts/{quote(name, safe='')}"
        try:
            response = self._http.get(path, params=params)
        except httpx.TransportError as exc:
            raise PolarMQError(0, "connection_error", f"{type(exc).__name__}: {exc}") from exc
        if not response.is_success:
            _parse(response)  # raises the API's error
        return response.content

    def save_artifacts(self, rollout_id: str, directory: Path, attempt: int | None = None) -> int:
        """Write a rollout's artifacts under `directory/<rollout id>/`; how many."""
        listing = self.artifacts(rollout_id, attempt)
        target = directory / rollout_id
        target.mkdir(parents=True, exist_ok=True)
        saved = 0
        for item in listing:
            name = str(item["name"])
            if name in ("", ".", "..") or Path(name).name != name:
                continue  # never write outside the rollout's folder
            (target / name).write_bytes(self.artifact(rollout_id, name, attempt))
            saved += 1
        return saved

    # -- lifecycle

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
