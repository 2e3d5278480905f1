"""Refuse new jobs while the broker is unreachable, instead of accepting work that cannot move.

Jobs are committed before their messages are published, so a job accepted during a broker outage
would wait for the sweeper to re-send its messages. When the broker is already known to be down,
a clear 503 with Retry-After is more useful to the trainer than a 201 for a job that is stuck, and
nothing is created. A reachable broker is re-checked at most every `ok_ttl_s`; an unreachable one
on every submission (with a short connect timeout), so service resumes as soon as it is back.
A publish that still fails after commit (the broker died in between) is recovered by the sweeper.
"""

from __future__ import annotations

import threading
import time

from fastapi import Request

from polar_mq.api.errors import ApiError
from polar_mq.api.readiness import OK, check_broker


class BrokerGate:
    def __init__(self, broker_url: str, ok_ttl_s: float = 2.0, timeout_s: float = 1.0) -> None:
        self.broker_url = broker_url
        self.ok_ttl_s = ok_ttl_s
        self.timeout_s = timeout_s
        self._ok_until = 0.0
        self._lock = threading.Lock()

    def problem(self) -> str | None:
        """None when the broker accepts connections, else why not."""
        if time.monotonic() < self._ok_until:
            return None
        with self._lock:
            if time.monotonic() < self._ok_until:
                return None
            result = check_broker(self.broker_url, self.timeout_s)
            if result == OK:
                self._ok_until = time.monotonic() + self.ok_ttl_s
                return None
            return result


def require_broker(request: Request) -> None:
    """Dependency of the submit route: 503 + Retry-After while the broker is unreachable."""
    gate: BrokerGate | None = getattr(request.app.state, "broker_gate", None)
    if gate is None:
        return
    problem = gate.problem()
    if problem is not None:
        raise ApiError(
            503, "unavailable", f"broker {problem}; nothing was created, retry later",
            headers={"Retry-After": "5"},
        )  # fmt: skip
