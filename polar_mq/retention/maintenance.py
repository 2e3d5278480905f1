"""The call store's periodic upkeep: partitions created ahead, and the automatic prune.

Run by the sweeper process (`polar-mq sweeper` starts it beside the sweep loop) every
`call_maintenance_interval_s`, first at start: it creates the next `call_partitions_ahead_days`
daily partitions, then, when `call_retention_days` is set, prunes calls older than that (exported
to `call_export_dir` first when it is set). Any number of sweepers may run: a PostgreSQL advisory
lock lets one of them do the round, the others skip it. Failures are logged; the next round retries.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from sqlalchemy import Engine, text

from polar_mq.config import Settings
from polar_mq.models.base import utcnow
from polar_mq.retention import partitions
from polar_mq.retention.prune import PruneReport, prune

log = logging.getLogger(__name__)

LOCK_KEY = 0x706F6C6172_52  # "polar" + "R": one maintenance round at a time, cluster-wide


def maintain(engine: Engine, settings: Settings, now: datetime | None = None) -> PruneReport | None:
    """One round; returns the prune's report (None: no prune configured, or another ran it)."""
    now = now or utcnow()
    with engine.connect() as lock_conn:
        if lock_conn.dialect.name == "postgresql":
            if not lock_conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}):
                return None
            lock_conn.commit()  # the lock is the session's; hold no transaction open meanwhile
        try:
            with engine.begin() as conn:
                if partitions.is_partitioned(conn):
                    created = partitions.ensure_ahead(
                        conn, now, settings.call_partitions_ahead_days
                    )
                    if created:
                        log.info("llm_calls partitions created: %s", ", ".join(created))
            if settings.call_retention_days is None:
                return None
            cutoff = now - timedelta(days=settings.call_retention_days)
            report = prune(engine, cutoff, export_dir=settings.call_export_dir)
            log.info(
                "calls before %s pruned: %d deleted, %d kept (running), %d partitions dropped",
                cutoff.isoformat(), report.rows_deleted, report.rows_kept,
                len(report.partitions_dropped),
            )  # fmt: skip
            return report
        finally:
            if lock_conn.dialect.name == "postgresql":
                lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
                lock_conn.commit()


def start_call_maintenance(settings: Settings, stop: threading.Event) -> threading.Thread:
    """A daemon thread running `maintain` every `call_maintenance_interval_s` until `stop`."""
    from polar_mq.infra.db import create_db_engine

    engine = create_db_engine(settings.database_url, pool_size=2, max_overflow=0)

    def loop() -> None:
        while not stop.is_set():
            try:
                maintain(engine, settings)
            except Exception:
                log.exception("call store maintenance failed; next round in %.0f s",
                              settings.call_maintenance_interval_s)  # fmt: skip
            stop.wait(settings.call_maintenance_interval_s)
        engine.dispose()

    thread = threading.Thread(target=loop, name="polar-call-maintenance", daemon=True)
    thread.start()
    return thread
