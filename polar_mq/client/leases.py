"""The group-lease operations of the client core: lease, ack, extend and `stream_groups`.

Apart from `core.py` to keep it small; `ClientCore` inherits them. Sans-IO like the rest of the
core (see `steps.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from polar_mq.client.errors import PolarMQError
from polar_mq.client.state import BatchFiller, default_consumer, delivery_ids, lease_body
from polar_mq.client.steps import Call, Emit, Op, Sleep, Stream, answer_dict

MAX_POLL_FAILURES = 10
MIN_POLL_S = 0.5
"""A stream whose long-poll is shorter than this sleeps this long after an empty answer."""
LOST_LEASE_WARNING = (
    "group delivery %s could not be acknowledged (%s): its lease expired and it was handed out "
    "again, so another consumer may train on it too; lease longer or extend leases"
)
log = logging.getLogger("polar_mq.client")


def retry_delay(exc: PolarMQError, failures: int) -> float:
    """Seconds to wait before retrying a failed call; raises `exc` when it is not worth it."""
    if not exc.transient or failures >= MAX_POLL_FAILURES:
        raise exc
    return min(0.5 * failures, 5.0)


def retrying(make: Callable[[], Op[Any]]) -> Op[Any]:
    """Run the operation `make()` builds, again after each transient failure (with backoff)."""
    failures = 0
    while True:
        try:
            return (yield from make())
        except PolarMQError as exc:
            failures += 1
            yield Sleep(retry_delay(exc, failures))


class GroupLeases:
    """Leasing complete groups: the trainer's at-least-once stream of training data."""

    timeout: float

    def lease_groups(
        self,
        job_id: str,
        consumer: str,
        max_groups: int = 16,
        lease_s: float = 60.0,
        wait_s: float = 0.0,
        include_trajectories: bool = False,
        advantages: str | None = None,
    ) -> Op[dict[str, Any]]:
        """Lease complete groups in completion order, waiting up to `wait_s` for the first.

        Each group has a `delivery` (id, count, lease expiry); `done` says nothing is left.
        """
        body = lease_body(consumer, max_groups, lease_s, wait_s, include_trajectories, advantages)
        return answer_dict(self._lease_call(job_id, body))

    def ack_groups(
        self, job_id: str, consumer: str, delivery_ids: Sequence[str]
    ) -> Op[dict[str, Any]]:
        """Acknowledge deliveries: their groups are never handed out again (all or nothing)."""
        body = {"consumer": consumer, "delivery_ids": list(delivery_ids)}
        return answer_dict(Call("POST", f"/v1/jobs/{job_id}/groups/ack", json=body))

    def extend_leases(
        self, job_id: str, consumer: str, delivery_ids: Sequence[str], lease_s: float = 60.0
    ) -> Op[dict[str, Any]]:
        """Push the leases of unacked deliveries to now + lease_s."""
        body = {"consumer": consumer, "delivery_ids": list(delivery_ids), "lease_s": lease_s}
        return answer_dict(Call("POST", f"/v1/jobs/{job_id}/groups/extend", json=body))

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
    ) -> Stream[list[dict[str, Any]]]:
        """Yield batches of complete groups, in completion order, until the job is done.

        Batches hold `batch_size` groups (the last ones may hold fewer). `ack="auto"`: a batch
        is acknowledged when you ask for the next one, so a crash while training on it means
        it is redelivered (to any consumer) after `lease_s`. `ack="manual"`: call
        `ack_groups(job_id, consumer, delivery_ids(batch))` yourself. Each group carries its
        `delivery` (`redelivered` is true when an earlier consumer did not ack it).
        """
        filler = BatchFiller(
            consumer or default_consumer(), batch_size, lease_s, wait_s, ack,
            include_trajectories, advantages,
        )  # fmt: skip
        while True:
            yield from self._extend_held(job_id, filler)
            lease = yield from retrying(
                lambda: answer_dict(self._lease_call(job_id, filler.lease_body()))
            )
            batch = filler.accept(lease)
            if batch is not None:
                yield Emit(batch)
                if filler.auto_ack:
                    yield from self._ack_consumed(job_id, filler.consumer, delivery_ids(batch))
            elif filler.done:
                return
            elif not lease["groups"] and filler.wait_s < MIN_POLL_S:
                yield Sleep(MIN_POLL_S)

    def _lease_call(self, job_id: str, body: dict[str, Any]) -> Call:
        # The server may hold the call for wait_s before answering.
        timeout = self.timeout + float(body["wait_s"])
        return Call("POST", f"/v1/jobs/{job_id}/groups/lease", json=body, timeout=timeout)

    def _extend_held(self, job_id: str, filler: BatchFiller) -> Op[None]:
        held = filler.held_to_extend()
        if not held:
            return
        consumer, lease_s = filler.consumer, filler.lease_s
        try:
            yield from retrying(lambda: self.extend_leases(job_id, consumer, held, lease_s))
        except PolarMQError as exc:
            if not exc.lost_lease:
                raise
            log.warning(LOST_LEASE_WARNING, ", ".join(held), exc.type)
        filler.extended()

    def _ack_consumed(self, job_id: str, consumer: str, ids: Sequence[str]) -> Op[None]:
        """Ack a consumed batch; a delivery lost to another consumer is warned about, not fatal."""
        try:
            yield from retrying(lambda: self.ack_groups(job_id, consumer, ids))
            return
        except PolarMQError as exc:
            if not exc.lost_lease:
                raise
        for one in ids:
            try:
                yield from retrying(lambda: self.ack_groups(job_id, consumer, [one]))  # noqa: B023
            except PolarMQError as exc:
                if not exc.lost_lease:
                    raise
                log.warning(LOST_LEASE_WARNING, one, exc.type)
