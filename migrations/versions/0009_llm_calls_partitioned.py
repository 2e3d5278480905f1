"""llm_calls partitioned by day on created_at (PostgreSQL), so retention drops whole days

Revision ID: 0009_llm_calls_partitioned
Revises: 0008_tenants
Create Date: 2026-12-03 23:00:00

The call log is the fastest-growing table; deleting old rows one by one leaves a bloated heap and
costs as much as the writes did. Range partitions by day let retention drop a whole day in one
statement (`polar_mq.retention`). The existing table is kept *in place*: it becomes the partition
`llm_calls_legacy` covering everything before today (or before the day after its newest row), so
upgrading copies no row; only its primary key is rebuilt, because the key of a partitioned table
must include the partition key: (id, created_at). Daily partitions from there to a week ahead
and a default partition (an insert never fails for want of a partition) are created here; the
maintenance loop keeps creating them ahead. SQLite (the embedded default) is left as it is.

The downgrade copies every row back into one plain table (the only way out of partitioning).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from alembic import op
from sqlalchemy import text

revision = "0009_llm_calls_partitioned"
down_revision = "0008_tenants"
branch_labels = None
depends_on = None

DAYS_AHEAD = 7


def _day(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _create_day(start: datetime) -> None:
    end = start + timedelta(days=1)
    op.execute(
        f"CREATE TABLE llm_calls_p{start:%Y%m%d} PARTITION OF llm_calls "
        f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
    )


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE llm_calls RENAME TO llm_calls_legacy")
    op.execute("ALTER INDEX ix_llm_calls_rollout_seq RENAME TO llm_calls_legacy_rollout_seq_idx")
    op.execute("ALTER TABLE llm_calls_legacy DROP CONSTRAINT pk_llm_calls")
    op.execute(
        "CREATE TABLE llm_calls (LIKE llm_calls_legacy INCLUDING DEFAULTS) "
        "PARTITION BY RANGE (created_at)"
    )
    op.execute("ALTER TABLE llm_calls ADD CONSTRAINT pk_llm_calls PRIMARY KEY (id, created_at)")
    op.execute("CREATE INDEX ix_llm_calls_rollout_seq ON llm_calls (rollout_id, seq)")

    today = _day(datetime.now(UTC))
    newest = bind.execute(text("SELECT max(created_at) FROM llm_calls_legacy")).scalar()
    if newest is None:
        op.execute("DROP TABLE llm_calls_legacy")
        first = today
    else:
        first = max(today, _day(newest) + timedelta(days=1))
        op.execute(
            "ALTER TABLE llm_calls_legacy ADD CONSTRAINT llm_calls_legacy_pkey "
            "PRIMARY KEY (id, created_at)"
        )
        op.execute(
            "ALTER TABLE llm_calls ATTACH PARTITION llm_calls_legacy "
            f"FOR VALUES FROM (MINVALUE) TO ('{first.isoformat()}')"
        )
    day = first
    while day <= today + timedelta(days=DAYS_AHEAD):
        _create_day(day)
        day += timedelta(days=1)
    op.execute("CREATE TABLE llm_calls_default PARTITION OF llm_calls DEFAULT")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("CREATE TABLE llm_calls_flat (LIKE llm_calls INCLUDING DEFAULTS)")
    op.execute("INSERT INTO llm_calls_flat SELECT * FROM llm_calls")
    op.execute("DROP TABLE llm_calls")
    op.execute("ALTER TABLE llm_calls_flat RENAME TO llm_calls")
    op.execute("ALTER TABLE llm_calls ADD CONSTRAINT pk_llm_calls PRIMARY KEY (id)")
    op.execute("CREATE INDEX ix_llm_calls_rollout_seq ON llm_calls (rollout_id, seq)")
