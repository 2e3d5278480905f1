"""Delete the calls older than a cutoff: whole partitions dropped, the boundary day trimmed.

Each partition is pruned in its own short transaction (locks held for one partition, never the
whole run), in range order:

- a day entirely before the cutoff is exported (if asked) and dropped with `DROP TABLE`: no row
  by row delete, no dead tuples, the disk space returned at once. If it holds calls of protected
  rollouts (`protection`), it is detached, those calls are re-inserted (they land in the default
  partition, whose range the detach just freed) and the rest dropped;
- the partition the cutoff falls in, the legacy partition (before migration 0009) and the default
  partition are trimmed with a `DELETE` of their unprotected rows older than the cutoff;
- newer partitions are not touched.

Without partitions (SQLite, or PostgreSQL before 0009) the whole table is trimmed the same way.
A dry run counts what would go and changes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, Engine, MetaData, Table, and_, delete, exists, func, select, text

from polar_mq.models import LlmCall, Rollout
from polar_mq.retention import partitions
from polar_mq.retention.export import export_path, write_calls
from polar_mq.retention.protection import PROTECTED, drop_protected, load_protected


@dataclass
class PruneReport:
    cutoff: datetime
    dry_run: bool
    rows_deleted: int = 0
    """Rows deleted, or with `dry_run` the rows that would be."""
    rows_kept: int = 0
    """Rows older than the cutoff kept because their rollout is protected."""
    rows_exported: int = 0
    protected_rollouts: int = 0
    partitions_dropped: list[str] = field(default_factory=list)
    partitions_trimmed: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    bytes_before: int | None = None
    bytes_after: int | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class _Target:
    name: str
    whole: bool
    """Every row is older than the cutoff: drop the partition instead of deleting rows."""


def table_bytes(conn: Connection) -> int | None:
    """`llm_calls` on disk: heap, TOAST and indexes of every partition (PostgreSQL only)."""
    if conn.dialect.name != "postgresql":
        return None
    return int(
        conn.scalar(
            text(
                "SELECT pg_total_relation_size('llm_calls') + coalesce(sum("
                "pg_total_relation_size(inhrelid)), 0) FROM pg_inherits "
                "WHERE inhparent = 'llm_calls'::regclass"
            )
        )
        or 0
    )


def _targets(conn: Connection, cutoff: datetime) -> list[_Target]:
    if not partitions.is_partitioned(conn):
        return [_Target(partitions.TABLE, whole=False)]
    targets = []
    for p in partitions.list_partitions(conn):
        if p.is_default or p.lower is None or p.lower < cutoff:
            whole = not p.is_default and p.upper is not None and p.upper <= cutoff
            targets.append(_Target(p.name, whole))
    return targets


def _as_table(name: str) -> Table:
    """The `llm_calls` columns under a partition's name (partitions can be queried directly)."""
    return cast(Table, LlmCall.__table__).to_metadata(MetaData(), name=name)


def prune(
    engine: Engine, cutoff: datetime, export_dir: Path | None = None, dry_run: bool = False
) -> PruneReport:
    """Export (if `export_dir`) and delete the unprotected calls created before `cutoff`."""
    started = time.perf_counter()
    report = PruneReport(cutoff=cutoff, dry_run=dry_run)
    with engine.connect() as conn:
        report.bytes_before = table_bytes(conn)
        targets = _targets(conn, cutoff)
        # Once per run, on this connection: a protected rollout may end meanwhile (and is kept
        # one more run), but an ended one never runs again, and any call older than the cutoff
        # belongs to a rollout that existed before this snapshot.
        report.protected_rollouts = load_protected(conn)
        conn.commit()
        for target in targets:
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(text(f"SET LOCAL lock_timeout = '{partitions.LOCK_TIMEOUT}'"))
                _prune_one(conn, target, report, export_dir)
        drop_protected(conn)
        conn.commit()
        report.bytes_after = table_bytes(conn)
    report.seconds = time.perf_counter() - started
    return report


def _prune_one(
    conn: Connection, target: _Target, report: PruneReport, export_dir: Path | None
) -> None:
    t = _as_table(target.name)
    protected = exists(select(PROTECTED.c.id).where(PROTECTED.c.id == t.c.rollout_id))
    old = t.c.created_at < report.cutoff
    victims = and_(old, ~protected)
    kept = int(conn.scalar(select(func.count()).select_from(t).where(old, protected)) or 0)
    if report.dry_run:
        report.rows_kept += kept
        report.rows_deleted += int(
            conn.scalar(select(func.count()).select_from(t).where(victims)) or 0
        )
        return
    if export_dir is not None:
        path = export_path(export_dir, target.name, report.cutoff)
        rollouts = Rollout.__table__
        query: Any = (
            select(t, rollouts.c.job_id)
            .outerjoin(rollouts, rollouts.c.id == t.c.rollout_id)
            .where(victims)
            .order_by(t.c.created_at)
        )
        exported = write_calls(conn, query, path)
        report.rows_exported += exported
        if exported:
            report.files.append(str(path))
        else:
            path.unlink(missing_ok=True)
    if target.whole:
        # The kept rows move to the default partition, trimmed (and counted) last.
        report.rows_deleted += int(conn.scalar(select(func.count()).select_from(t)) or 0) - kept
        _drop(conn, target.name, keep_protected=kept > 0)
        report.partitions_dropped.append(target.name)
    else:
        report.rows_kept += kept
        deleted = conn.execute(delete(t).where(victims)).rowcount
        report.rows_deleted += deleted
        if deleted:
            report.partitions_trimmed.append(target.name)


def _drop(conn: Connection, name: str, keep_protected: bool) -> None:
    if keep_protected:
        columns = ", ".join(c.name for c in LlmCall.__table__.columns)
        conn.execute(text(f"ALTER TABLE {partitions.TABLE} DETACH PARTITION {name}"))
        conn.execute(
            text(
                f"INSERT INTO {partitions.TABLE} ({columns}) SELECT {columns} FROM {name} "
                "WHERE rollout_id IN (SELECT id FROM retention_protected)"
            )
        )
    conn.execute(text(f"DROP TABLE {name}"))
