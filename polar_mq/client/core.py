"""Every client operation, written once as a sans-IO generator (see `steps.py`).

`Client` and `AsyncClient` expose these same operations; they only perform the steps. Request
shapes, response decoding, retries, pagination, polling and the lease protocol live here.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from polar_mq.client.errors import PolarMQError, Submission
from polar_mq.client.leases import MAX_POLL_FAILURES, GroupLeases
from polar_mq.client.state import Deadline, GroupFollower, is_done
from polar_mq.client.steps import (
    Call,
    Emit,
    Op,
    Sleep,
    Stream,
    answer,
    answer_dict,
    collect,
    emit_all,
    for_each,
)

if TYPE_CHECKING:
    from polar_mq.client.export import ExportSummary, ExportWriter

DEFAULT_TIMEOUT_S = 30.0
ADAPTER_LOAD_TIMEOUT_S = 330.0
"""A policy update with an adapter also waits for the proxies to load it (theirs: 300 s)."""
EXPORT_PAGE_SIZE = 16
"""Groups per results page while exporting: pages carry token arrays, keep them modest."""
SUBMIT_ATTEMPTS = 3
Group = dict[str, Any]


API_KEY_ENV = "POLAR_MQ_API_KEY"
"""Where a client finds its key when none is passed (as the `polar-mq` commands do)."""


def headers(api_key: str | None) -> dict[str, str]:
    """The headers of every request of a client; no key given: `$POLAR_MQ_API_KEY`, if set."""
    if api_key is None:
        api_key = os.environ.get(API_KEY_ENV) or None
    sent = {"Accept": "application/json", "User-Agent": "polar-mq-client"}
    if api_key:
        sent["Authorization"] = f"Bearer {api_key}"
    return sent


def page_rollouts(page: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(rollout id, attempt) of every sample of a results page."""
    return [
        (str(sample["rollout_id"]), int(sample["attempt"]))
        for group in page.get("groups") or []
        for sample in group.get("samples") or []
    ]


def _results_params(
    complete_only: bool,
    include_trajectories: bool,
    limit: int,
    cursor: str | None,
    advantages: str | None,
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "complete_only": str(complete_only).lower(),
        "include_trajectories": str(include_trajectories).lower(),
        "limit": limit,
    }
    if cursor is not None:
        params["cursor"] = cursor
    if advantages is not None:
        params["advantages"] = advantages
    return params


def _export_writer(
    job_id: str, path: str | os.PathLike[str], format: str | None, advantages: str | None
) -> ExportWriter:
    from polar_mq.client.export import ExportWriter, resolve_format

    target = Path(path)
    return ExportWriter(target, resolve_format(target, format), job_id, advantages is not None)


class ClientCore(GroupLeases):
    """The operations of the REST API; `timeout` is the client's, for calls that wait longer."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout = timeout

    # -- jobs

    def submit(
        self, /, tasks: Sequence[Mapping[str, Any]], samples_per_task: int = 1, **spec: Any
    ) -> Op[Submission]:
        """Submit tasks x samples_per_task rollouts; other JobCreate fields go in **spec."""
        spec = {"tasks": list(tasks), "samples_per_task": samples_per_task, **spec}
        return self.submit_spec(spec)

    def submit_spec(self, spec: Mapping[str, Any]) -> Op[Submission]:
        """Submit a full job spec (the body of POST /v1/jobs); retried on transient failures.

        Safe to retry: a spec without an `idempotency_key` gets a fresh one, so a retry after a
        dropped connection returns the job the first attempt created instead of a second job.
        """
        body = dict(spec)
        if not body.get("idempotency_key"):
            body["idempotency_key"] = f"client-{uuid.uuid4().hex}"
        call = Call(
            "POST", "/v1/jobs", content=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        for attempt in range(1, SUBMIT_ATTEMPTS + 1):
            try:
                data = yield call
                return Submission(
                    str(data["job_id"]), [str(r) for r in data["rollout_ids"]], data["created"]
                )
            except PolarMQError as exc:
                if not exc.transient or attempt == SUBMIT_ATTEMPTS:
                    raise
                yield Sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    def status(self, job_id: str) -> Op[dict[str, Any]]:
        return answer_dict(Call("GET", f"/v1/jobs/{job_id}"))

    def cancel(self, job_id: str) -> Op[dict[str, Any]]:
        """Cancel every unfinished rollout of a job: {"cancelled": [...], "already_terminal": n}."""
        return answer_dict(Call("POST", f"/v1/jobs/{job_id}/cancel"))

    def cancel_rollout(self, rollout_id: str) -> Op[dict[str, Any]]:
        return answer_dict(Call("POST", f"/v1/rollouts/{rollout_id}/cancel"))

    def jobs(self, limit: int = 50, cursor: str | None = None) -> Op[dict[str, Any]]:
        """One page of jobs, newest first: {"jobs": [...], "next_cursor": ...}."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return answer_dict(Call("GET", "/v1/jobs", params=params))

    def wait(
        self,
        job_id: str,
        poll_s: float = 1.0,
        timeout: float | None = None,
        show: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> Op[dict[str, Any]]:
        """Poll until every rollout is terminal (or the job is cancelled); the final status.

        Raises TimeoutError after `timeout` seconds. Brief outages of the API are ridden out.
        `show` sees every status polled (the sync client's progress bar).
        """
        deadline = Deadline(timeout)
        failures = 0
        while True:
            try:
                status = yield from self.status(job_id)
                failures = 0
            except PolarMQError as exc:
                failures += 1
                if not exc.transient or failures >= MAX_POLL_FAILURES:
                    raise
            else:
                if show is not None:
                    show(status)
                if is_done(status):
                    return status
            deadline.check(f"job {job_id}")
            yield Sleep(poll_s)

    # -- results

    def iter_pages(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> Stream[dict[str, Any]]:
        """Every results page available now (follows next_cursor until it is null)."""
        cursor: str | None = None
        while True:
            params = _results_params(
                complete_only, include_trajectories, page_size, cursor, advantages
            )
            page = yield Call("GET", f"/v1/jobs/{job_id}/results", params=params)
            yield Emit(page)
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
    ) -> Stream[Group]:
        """Every group available now, page by page.

        `advantages="grpo"` adds each usable sample's group-relative advantage.
        """
        pages = self.iter_pages(job_id, complete_only, include_trajectories, page_size, advantages)
        return for_each(pages, lambda page: emit_all(page["groups"]))

    def results(
        self,
        job_id: str,
        complete_only: bool = True,
        include_trajectories: bool = False,
        page_size: int = 100,
        advantages: str | None = None,
    ) -> Op[list[Group]]:
        """All groups available now (all pages): complete groups by default."""
        return collect(
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
    ) -> Stream[Group]:
        """Yield each complete group once, as it completes, until the job is finished."""
        follower = GroupFollower()
        deadline = Deadline(timeout)
        while not follower.done:
            params = _results_params(
                True, include_trajectories, page_size, follower.cursor, advantages
            )
            page = yield Call("GET", f"/v1/jobs/{job_id}/results", params=params)
            fresh, more = follower.accept(page)
            yield from emit_all(fresh)
            if not more and not follower.done:
                deadline.check(f"job {job_id}")
                yield Sleep(poll_s)

    def export(
        self,
        job_id: str,
        path: str | os.PathLike[str],
        format: str | None = None,
        complete_only: bool = True,
        advantages: str | None = None,
        page_size: int = EXPORT_PAGE_SIZE,
        artifacts_dir: str | os.PathLike[str] | None = None,
    ) -> Op[ExportSummary]:
        """Write the job's training samples to `path` as jsonl or parquet (default: by suffix).

        One row per training sample (see `polar_mq.client.export`); streamed page by page. Exports
        the groups available now: `summary.job_finished` is False when the job was still running.
        With `artifacts_dir`, each exported rollout's artifacts (agent log, transcript, diff) are
        saved as `artifacts_dir/<rollout id>/<name>` too. A failed export leaves no file.
        """
        writer = _export_writer(job_id, path, format, advantages)
        saved = 0

        def write(page: dict[str, Any]) -> Op[None]:
            nonlocal saved
            writer.add_page(page)
            if artifacts_dir is not None:
                for rollout_id, attempt in page_rollouts(page):
                    saved += yield from self.save_artifacts(rollout_id, artifacts_dir, attempt)

        with writer:
            pages = self.iter_pages(job_id, complete_only, True, page_size, advantages)
            yield from for_each(pages, write)
            summary = writer.finish()
        return dataclasses.replace(summary, artifacts=saved)

    # -- policy versions (weight updates)

    def policy(self) -> Op[dict[str, Any]]:
        """{"version", "paused", "updated_at"}: the trainer's current policy version."""
        return answer_dict(Call("GET", "/v1/policy"))

    def set_policy(
        self,
        version: int,
        pause: bool = False,
        drain_timeout_s: float = 30.0,
        adapter_path: str | None = None,
        checkpoint_path: str | None = None,
    ) -> Op[dict[str, Any]]:
        """Declare policy `version`. With `pause`, LLM calls are held and the ones in flight
        drained before this returns (load the weights, then call `resume_policy`).

        With `adapter_path` (a LoRA adapter directory the inference servers can read, e.g. what
        peft's `save_pretrained` wrote) the proxies load the new weights themselves: pause,
        drain, load into every backend, resume; calls after this returns are served by them.
        The answer's `adapter_loaded` says whether every backend carries it. `checkpoint_path`
        (a full model directory) does the same for engines that reload weights from disk."""
        body: dict[str, Any] = {
            "version": version,
            "pause": pause,
            "drain_timeout_s": drain_timeout_s,
        }
        if adapter_path is not None:
            body["adapter_path"] = adapter_path
        if checkpoint_path is not None:
            body["checkpoint_path"] = checkpoint_path
        weights = adapter_path is not None or checkpoint_path is not None
        loading = ADAPTER_LOAD_TIMEOUT_S if weights else 0.0
        timeout = self.timeout + loading + (drain_timeout_s if pause or loading else 0.0)
        return answer_dict(Call("POST", "/v1/policy", json=body, timeout=timeout))

    def resume_policy(self) -> Op[dict[str, Any]]:
        """The new weights are loaded: held LLM calls go ahead on the current version."""
        return answer_dict(Call("POST", "/v1/policy/resume"))

    # -- rollouts

    def rollout(self, rollout_id: str) -> Op[dict[str, Any]]:
        """Fields, events, stage timings, error and evaluation of one rollout."""
        return answer_dict(Call("GET", f"/v1/rollouts/{rollout_id}"))

    def trajectory(self, rollout_id: str) -> Op[dict[str, Any]]:
        """Training samples (token ids, loss mask, logprobs, messages) of one rollout."""
        return answer_dict(Call("GET", f"/v1/rollouts/{rollout_id}/trajectory"))

    def calls(self, rollout_id: str) -> Op[list[dict[str, Any]]]:
        """The LLM calls captured for one rollout, in order."""
        data = yield Call("GET", f"/v1/rollouts/{rollout_id}/calls")
        return list(data["calls"])

    def artifacts(self, rollout_id: str, attempt: int | None = None) -> Op[list[dict[str, Any]]]:
        """Name, size, media type and `truncated` of each artifact of an attempt (default:
        the current one): agent.log, the harness's transcripts, workspace.diff."""
        params = {} if attempt is None else {"attempt": attempt}
        data = yield Call("GET", f"/v1/rollouts/{rollout_id}/artifacts", params=params)
        return list(data["artifacts"])

    def artifact(self, rollout_id: str, name: str, attempt: int | None = None) -> Op[bytes]:
        """One artifact's stored content."""
        params = {} if attempt is None else {"attempt": attempt}
        path = f"/v1/rollouts/{rollout_id}/artifacts/{quote(name, safe='')}"
        return answer(Call("GET", path, params=params, raw=True))

    def save_artifacts(
        self, rollout_id: str, directory: str | os.PathLike[str], attempt: int | None = None
    ) -> Op[int]:
        """Write a rollout's artifacts under `directory/<rollout id>/`; how many."""
        listing = yield from self.artifacts(rollout_id, attempt)
        target = Path(directory) / rollout_id
        target.mkdir(parents=True, exist_ok=True)
        saved = 0
        for item in listing:
            name = str(item["name"])
            if name in ("", ".", "..") or Path(name).name != name:
                continue  # never write outside the rollout's folder
            content = yield from self.artifact(rollout_id, name, attempt)
            (target / name).write_bytes(content)
            saved += 1
        return saved
