"""The daily partitions of `llm_calls` (PostgreSQL): list them, and create them ahead of time.

Migration 0009 partitions the table by range on `created_at`, one partition per UTC day named
`llm_calls_pYYYYMMDD`, plus `llm_calls_legacy` (the table as it was before, everything up to the
migration day) and `llm_calls_default` (whatever no partition covers, so an insert never fails).
Maintenance keeps `ahead` days of partitions created, so the default partition normally stays
empty: a row lands there only when the clock jumps past every partition or maintenance stopped.
A day whose rows already sit in the default partition is created by moving them out first
(PostgreSQL refuses a partition that would make rows of the default partition misplaced).

DDL takes a short exclusive lock on the parent; `lock_timeout` makes maintenance give up (and try
again next round) rather than queue the proxy's inserts behind a long-running reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, text

TABLE = "llm_calls"
DEFAULT = "llm_calls_default"
LOCK_TIMEOUT = "5s"
_BOUND = re.compile(r"FROM \((.+)\) TO \((.+)\)")


@dataclass(frozen=True)
class Partition:
    """One partition and its range; `lower`/`upper` None: unbounded (MINVALUE/MAXVALUE)."""

    name: str
    lower: datetime | None
    upper: datetime | None
    is_default: bool = False


def day_start(value: datetime) -> datetime:
    """Midnight UTC of `value`'s day: partitions are UTC days."""
    return value.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def day_name(day: datetime) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def is_partitioned(conn: Connection) -> bool:
    """True on PostgreSQL once migration 0009 ran (SQLite keeps one plain table)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.scalar(
        text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": TABLE}
    )
    return bool(kind == "p")


def _bound(expr: str) -> tuple[datetime | None, datetime | None]:
    match = _BOUND.search(expr)
    if match is None:
        raise ValueError(f"unexpected partition bound: {expr}")
    lower, upper = (
        None if raw in ("MINVALUE", "MAXVALUE") else datetime.fromisoformat(raw.strip("'"))
        for raw in match.groups()
    )
    return lower, upper


def list_partitions(conn: Connection) -> list[Partition]:
    """Every partition of `llm_calls`, ordered by range (the default partition last)."""
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:t)"
        ),
        {"t": TABLE},
    ).tuples()
    parts: list[Partition] = []
    for name, expr in rows:
        if expr == "DEFAULT":
            parts.append(Partition(name, None, None, is_default=True))
        else:
            parts.append(Partition(name, *_bound(expr)))
    floor = datetime.min.replace(tzinfo=UTC)
    return sorted(parts, key=lambda p: (p.is_default, p.lower or floor))


def create_day(conn: Connection, day: datetime) -> str:
    """Create the partition of `day` (UTC), first moving its rows out of the default partition."""
    start, end = day_start(day), day_start(day) + timedelta(days=1)
    name = day_name(start)
    bounds = {"lo": start, "hi": end}
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    stray = conn.scalar(
        text(f"SELECT count(*) FROM {DEFAULT} WHERE created_at >= :lo AND created_at < :hi"),
        bounds,
    )
    range_sql = f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
    if not stray:
        conn.execute(text(f"CREATE TABLE {name} PARTITION OF {TABLE} {range_sql}"))
        return name
    conn.execute(text(f"CREATE TABLE {name} (LIKE {TABLE} INCLUDING DEFAULTS)"))
    conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {DEFAULT} WHERE created_at >= :lo AND created_at < :hi "
            f"RETURNING *) INSERT INTO {name} SELECT * FROM moved"
        ),
        bounds,
    )
    conn.execute(text(f"ALTER TABLE {TABLE} ATTACH PARTITION {name} {range_sql}"))
    return name


def ensure_ahead(conn: Connection, now: datetime, ahead_days: int) -> list[str]:
    """Create the missing day partitions from today to `ahead_days` ahead; returns their names.

    Days already covered (by a day partition or the legacy one) are skipped; past days are never
    created (their rows, if any, stay in the default partition until pruned).
    """
    parts = [p for p in list_partitions(conn) if not p.is_default]
    floor = datetime.min.replace(tzinfo=UTC)
    ceiling = datetime.max.replace(tzinfo=UTC)

    def covered(day: datetime) -> bool:
        return any((p.lower or floor) <= day < (p.upper or ceiling) for p in parts)

    today = day_start(now)
    created = []
    for offset in range(ahead_days + 1):
        day = today + timedelta(days=offset)
        if not covered(day):
            created.append(create_day(conn, day))
    return created
