"""Is an engine there? Asked when an agent failed without any LLM call stored, or with its last
call unanswered (502, 503, 504).

An engine that is down answers nothing, so the proxy stores no call for the agent's requests and
the run looks like a harness that never called the model. The proxy is the one process that
talks to the engines and knows which it can use (health checks, circuit breakers), so it is
asked, on its `/healthz`: no usable engine behind it is the platform's failure; any usable
engine, or a proxy that cannot be asked, leaves the verdict to the stored calls. A worker never
probes engine addresses itself: it may not be able to reach them, and may not know them.
"""

from __future__ import annotations

import httpx

from polar_mq.infra.tls import client_ssl_context
from polar_mq.jobs.verdicts import ENGINE_DOWN

PROBE_TIMEOUT_S = 3.0
"""Longer than a healthy proxy's answer to /healthz, short beside a stage."""


def engines_down(proxy_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the proxy at `proxy_url` has no engine to send calls to, or None when it has one
    (or cannot say: not reachable, or an older proxy without the counts)."""
    try:
        with httpx.Client(timeout=timeout_s, verify=client_ssl_context()) as client:
            health = client.get(f"{proxy_url.rstrip('/')}/healthz").json()
    except (httpx.HTTPError, ValueError):
        return None
    total, usable = health.get("backends"), health.get("backends_usable")
    if not isinstance(total, int) or not isinstance(usable, int) or usable > 0:
        return None
    return (
        f"{ENGINE_DOWN} at {proxy_url} ({usable} of {total} engines usable): the agent's LLM "
        "calls could not be served; start the engine or fix the proxy's POLAR_MQ_UPSTREAM_URL(S)"
    )
