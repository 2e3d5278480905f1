"""A per-backend circuit breaker: stop sending calls to a backend that keeps failing.

Closed: calls flow; `failure_threshold` consecutive failures (connect errors, 5xx before the
response started, failed health checks) open it. Open: no calls for `cooldown_s`. Then half-open:
exactly one call at a time is let through as a probe; its success closes the breaker, its failure
opens it again for another cooldown. A passing health check closes it at any time, so a backend
that comes back is used again even when no call probes it.
"""

from __future__ import annotations

import time

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, failure_threshold: int, cooldown_s: float) -> None:
        if failure_threshold < 1 or cooldown_s < 0:
            raise ValueError("failure_threshold must be >= 1 and cooldown_s >= 0")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self.failures = 0
        """Consecutive failures since the last success."""
        self.opened_at: float | None = None
        self.times_opened = 0
        self._probing = False

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return CLOSED
        if time.monotonic() - self.opened_at >= self.cooldown_s:
            return HALF_OPEN
        return OPEN

    def available(self) -> bool:
        """Whether a call may be sent now (no side effect; see `on_dispatch`)."""
        if self.opened_at is None:
            return True
        return not self._probing and self.state == HALF_OPEN

    def on_dispatch(self) -> None:
        """A call was sent: in half-open state it is the one probe allowed."""
        if self.opened_at is not None:
            self._probing = True

    def cancel_probe(self) -> None:
        """A dispatched call ended without a verdict (the agent left first): free the probe slot."""
        self._probing = False

    def record_success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self._probing = False

    def record_failure(self) -> None:
        self.failures += 1
        self._probing = False
        if self.opened_at is not None or self.failures >= self.failure_threshold:
            self.trip()

    def trip(self) -> None:
        """Open now (or restart the cooldown of an already open breaker)."""
        if self.opened_at is None:
            self.times_opened += 1
        self.opened_at = time.monotonic()
        self._probing = False

    def retry_after_s(self) -> float:
        """Seconds until a probe may be sent (0 when calls flow)."""
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.opened_at + self.cooldown_s - time.monotonic())
