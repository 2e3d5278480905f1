"""What a client call returns or raises besides plain dicts: `PolarMQError` and `Submission`."""

from __future__ import annotations

from dataclasses import dataclass

TRANSIENT_STATUSES = frozenset({502, 503, 504})


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

    @property
    def lost_lease(self) -> bool:
        """A 409 on ack/extend: the lease went to another consumer (or was acked elsewhere)."""
        return self.status == 409


@dataclass(frozen=True, slots=True)
class Submission:
    job_id: str
    rollout_ids: list[str]
    created: bool
    """False when the idempotency key named a job that already existed."""
