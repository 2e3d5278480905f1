"""What the sync and async clients share: errors, request shapes, response parsing, the
group-following state and the export writer hookup."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import orjson

if TYPE_CHECKING:
    from polar_mq.export import ExportWriter

DEFAULT_TIMEOUT_S = 30.0
EXPORT_PAGE_SIZE = 16
"""Groups per results page while exporting: pages carry token arrays, keep them modest."""
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


def page_rollouts(page: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(rollout id, attempt) of every sample of a results page."""
    return [
        (str(sample["rollout_id"]), int(sample["attempt"]))
        for group in page.get("groups") or []
        for sample in group.get("samples") or []
    ]


def _submission(data: Mapping[str, Any]) -> Submission:
    return Submission(str(data["job_id"]), [str(r) for r in data["rollout_ids"]], data["created"])


def _results_params(
    complete_only: bool,
    include_trajectories: bool,
    limit: int,
    cursor: str | None,
    advantages: str | None = None,
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
    from polar_mq.export import ExportWriter, resolve_format

    target = Path(path)
    return ExportWriter(target, resolve_format(target, format), job_id, advantages is not None)


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
# Group leases: the batching state behind `stream_groups`

ACK_MODES = ("auto", "manual")


def default_consumer() -> str:
    """A consumer name unique to this process: `<host>-<pid>-<random>`."""
    import socket

    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def delivery_ids(groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """The delivery ids of leased groups (what `ack_groups` takes)."""
    return [str(g["delivery"]["delivery_id"]) for g in groups]


def _lease_body(
    consumer: str,
    max_groups: int,
    lease_s: float,
    wait_s: float,
    include_trajectories: bool,
    advantages: str | None,
) -> dict[str, Any]:
    return {
        "consumer": consumer, "max_groups": max_groups, "lease_s": lease_s, "wait_s": wait_s,
        "include_trajectories": include_trajectories, "advantages": advantages,
    }  # fmt: skip


MIN_POLL_S = 0.5
"""A stream whose long-poll is shorter than this sleeps this long after an empty answer."""


def _retry_delay(exc: PolarMQError, failures: int) -> float:
    """Seconds to wait before retrying a failed call; raises `exc` when it is not worth it."""
    if not exc.transient or failures >= MAX_POLL_FAILURES:
        raise exc
    return min(0.5 * failures, 5.0)


def _lost_lease(exc: PolarMQError) -> bool:
    """A 409 on ack/extend: the lease went to another consumer (or was acked elsewhere)."""
    return exc.status == 409


LOST_LEASE_WARNING = (
    "group delivery %s could not be acknowledged (%s): its lease expired and it was handed out "
    "again, so another consumer may train on it too; lease longer or extend leases"
)


class _BatchFiller:
    """Collects leased groups into batches of `batch_size` for `stream_groups`.

    Groups are leased until the batch is full; a partial batch goes out only once the job is
    finished and nothing more is leasable now (the last groups, or redeliveries). Leases of the
    groups held while the batch fills are extended when half their time has passed, so a slow
    fill never lets them expire. With auto-ack, a batch is acknowledged when the consumer asks for
    the next one: a consumer that dies while holding it gets it redelivered elsewhere.
    """

    def __init__(
        self,
        consumer: str,
        batch_size: int,
        lease_s: float,
        wait_s: float,
        ack: str,
        include_trajectories: bool,
        advantages: str | None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if ack not in ACK_MODES:
            raise ValueError(f"ack must be one of {', '.join(ACK_MODES)}, not {ack!r}")
        self.consumer = consumer
        self.batch_size = batch_size
        self.lease_s = lease_s
        self.wait_s = wait_s
        self.auto_ack = ack == "auto"
        self.include_trajectories = include_trajectories
        self.advantages = advantages
        self.batch: list[dict[str, Any]] = []
        self.renewed_at = 0.0
        self.done = False

    def lease_body(self) -> dict[str, Any]:
        # While groups are held, no wait may outlast a third of their lease: the extension
        # check runs between lease calls.
        wait_s = min(self.wait_s, self.lease_s / 3) if self.batch else self.wait_s
        return _lease_body(
            self.consumer, self.batch_size - len(self.batch), self.lease_s, wait_s,
            self.include_trajectories, self.advantages,
        )  # fmt: skip

    def held_to_extend(self) -> list[str]:
        """Delivery ids of the held groups whose leases are due for extension (else [])."""
        if self.batch and time.monotonic() - self.renewed_at > self.lease_s / 3:
            return delivery_ids(self.batch)
        return []

    def extended(self) -> None:
        self.renewed_at = time.monotonic()

    def accept(self, lease: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """Take a lease answer; a batch when one is ready to hand to the consumer."""
        asked = self.batch_size - len(self.batch)
        if lease["groups"] and not self.batch:
            self.renewed_at = time.monotonic()
        self.batch.extend(lease["groups"])
        self.done = bool(lease["done"])
        drained = bool(lease["job_finished"]) and len(lease["groups"]) < asked
        if len(self.batch) >= self.batch_size or (self.batch and (drained or self.done)):
            batch, self.batch = self.batch, []
            return batch
        return None
