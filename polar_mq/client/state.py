"""The client-side state of following a job: deadlines, the group follower behind `iter_groups`
and the batch filler behind `stream_groups` (no I/O here: `core.py` drives them)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any


def is_done(status: Mapping[str, Any]) -> bool:
    return status.get("state") != "running"


class GroupFollower:
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


class Deadline:
    def __init__(self, timeout: float | None) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout

    def check(self, what: str) -> None:
        if self.at is not None and time.monotonic() >= self.at:
            raise TimeoutError(f"{what} not finished after {self.timeout} s")


ACK_MODES = ("auto", "manual")


def default_consumer() -> str:
    """A consumer name unique to this process: `<host>-<pid>-<random>`."""
    import socket

    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def delivery_ids(groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """The delivery ids of leased groups (what `ack_groups` takes)."""
    return [str(g["delivery"]["delivery_id"]) for g in groups]


def lease_body(
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


class BatchFiller:
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
        return lease_body(
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
