"""The system page's read service: workers and slots, queue depths, proxies, the policy.

Only what is cheap to read from where it already lives:

- the policy version and pause flag: `policy_state` (PostgreSQL);
- stages in flight per node: the rollouts holding a lease (an index on status);
- workers of this deployment (those consuming a queue of its `queue_prefix`: the control
  broadcast reaches every worker on the broker), their slots and the queues they consume: two
  Celery `inspect` broadcasts, sent at once (answers within `INSPECT_TIMEOUT_S`; a worker that
  does not answer in time is not listed);
  how busy each node is comes from the leases in the database, not from another broadcast;
- queue depths: a passive declare per queue on the broker, for the queues the workers named;
- proxy backends (load, breaker, pause, policy version): each proxy's `GET /admin/backends` with
  the admin token.

Each part fails on its own: the page shows what could be read and says which part could not.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from polar_mq.config import Settings
from polar_mq.infra.tls import client_ssl_context
from polar_mq.lifecycle.stages import STAGE_OF_STATUS
from polar_mq.models import Rollout
from polar_mq.policy.state import PolicyView, current_policy

log = logging.getLogger(__name__)

INSPECT_TIMEOUT_S = 1.0
PROXY_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    name: str
    slots: int | None
    """The pool's concurrency (`max-concurrency`)."""
    pool: str | None
    queues: list[str]


@dataclass(frozen=True, slots=True)
class ProxyInfo:
    url: str
    backends: list[dict[str, Any]]
    error: str | None = None


@dataclass(slots=True)
class SystemView:
    policy: PolicyView
    in_flight: dict[str, dict[str, int]]
    """Node -> `<stage> <queued|running>` -> rollouts (lease holders and node-bound waits)."""
    workers: list[WorkerInfo] = field(default_factory=list)
    queues: dict[str, int | None] = field(default_factory=dict)
    proxies: list[ProxyInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def in_flight_by_node(session: Session) -> dict[str, dict[str, int]]:
    rows = session.execute(
        select(Rollout.node, Rollout.status, func.count())
        .where(Rollout.status.in_(list(STAGE_OF_STATUS)))
        .group_by(Rollout.node, Rollout.status)
    ).tuples()
    out: dict[str, dict[str, int]] = {}
    for node, status, count in rows:
        stage, slot = STAGE_OF_STATUS[status]
        out.setdefault(node or "(no node yet)", {})[f"{stage} {slot}"] = count
    return out


def celery_view(settings: Settings, view: SystemView) -> None:
    """Workers and queue depths through the broker (adds to `view.problems` on failure)."""
    from polar_mq.dispatch.celery_app import create_celery, queue_depth

    app = create_celery(settings)
    try:
        # Each broadcast waits its whole timeout for late answers: ask both at once.
        with ThreadPoolExecutor(2) as threads:
            asked = [
                threads.submit(getattr(app.control.inspect(timeout=INSPECT_TIMEOUT_S), method))
                for method in ("stats", "active_queues")
            ]
            stats: dict[str, Any] = asked[0].result() or {}
            queues: dict[str, Any] = asked[1].result() or {}
        names: set[str] = set()
        for worker in sorted(set(stats) | set(queues)):
            pool = (stats.get(worker) or {}).get("pool") or {}
            own = sorted(q.get("name", "") for q in queues.get(worker) or [] if isinstance(q, dict))
            ours = [q for q in own if q.startswith(f"{settings.queue_prefix}.")]
            if queues and not ours:
                continue  # another deployment sharing the broker (its own queue prefix)
            names.update(ours)
            view.workers.append(
                WorkerInfo(
                    name=worker,
                    slots=pool.get("max-concurrency"),
                    pool=pool.get("implementation"),
                    queues=own,
                )
            )
        view.queues = {name: queue_depth(app, name) for name in sorted(names)}
    except Exception as exc:  # the broker may be down: the rest of the page still helps
        log.warning("system page: broker unreadable: %s", exc)
        view.problems.append(f"workers and queues unavailable: broker unreadable ({exc})")
    finally:
        app.close()


def proxies_view(settings: Settings, view: SystemView) -> None:
    headers = {}
    if settings.proxy_admin_token:
        headers["authorization"] = f"Bearer {settings.proxy_admin_token}"
    with httpx.Client(
        timeout=PROXY_TIMEOUT_S, headers=headers, verify=client_ssl_context()
    ) as client:
        for base in settings.proxy_admin_bases:
            try:
                answer = client.get(f"{base}/admin/backends")
                answer.raise_for_status()
                backends = answer.json().get("backends") or []
                view.proxies.append(ProxyInfo(base, [b for b in backends if isinstance(b, dict)]))
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                view.proxies.append(ProxyInfo(base, [], f"{type(exc).__name__}: {exc}"))


def system_view(session: Session, settings: Settings, *, broker: bool = True) -> SystemView:
    """Everything the system page shows; `broker=False` skips the Celery broadcast."""
    view = SystemView(policy=current_policy(session), in_flight=in_flight_by_node(session))
    if broker:
        celery_view(settings, view)
    proxies_view(settings, view)
    return view
