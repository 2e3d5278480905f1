"""Which rollouts' calls a prune must keep, however old: the retention rule in one query.

A call older than the cutoff is deleted unless its rollout is *protected*:

1. its job is still running: some rollout of the job is not terminal (held, queued, in a stage).
   The build stage reads a rollout's calls, a retried attempt may still be built, and staleness
   (`polar_mq.policy.staleness`) judges a group by the policy versions of its calls, so no call
   of an unfinished job goes, even one made weeks ago by a long-held job;
2. its group is not delivered yet in a job consumed by leases (the job has a `group_deliveries`
   row): the group was never acknowledged, so a trainer may still lease it and the staleness
   check runs on it again. Jobs read through the results cursor have no delivery to wait for
   once finished: their groups were readable since completion.

Deleting calls never touches training data: results and exports read `trajectory_samples`.
The protected ids go to a temporary table, filled once per prune run, so each prune statement
joins against it (an array of a million ids would be compared row by row).
"""

from __future__ import annotations

from sqlalchemy import Connection, column, table, text

from polar_mq.models import RolloutStatus

PROTECTED = table("retention_protected", column("id"))
"""The temporary table of protected rollout ids (one per prune run, on its connection)."""

_TERMINAL = ", ".join(f"'{s}'" for s in sorted(RolloutStatus.TERMINAL))
_RULE = f"""
SELECT r.id FROM rollouts r WHERE r.job_id IN (
    SELECT DISTINCT job_id FROM rollouts WHERE status NOT IN ({_TERMINAL}))
UNION
SELECT r.id FROM rollouts r
WHERE r.job_id IN (SELECT DISTINCT job_id FROM group_deliveries)
  AND NOT EXISTS (
    SELECT 1 FROM group_deliveries d
    WHERE d.job_id = r.job_id AND d.task_index = r.task_index AND d.acked_at IS NOT NULL)
"""


def load_protected(conn: Connection) -> int:
    """Fill the temporary table of protected rollout ids; returns how many there are."""
    conn.execute(text("DROP TABLE IF EXISTS retention_protected"))
    kind = "UUID" if conn.dialect.name == "postgresql" else "CHAR(32)"  # SQLite: as sa.Uuid
    conn.execute(text(f"CREATE TEMPORARY TABLE retention_protected (id {kind} PRIMARY KEY)"))
    conn.execute(text(f"INSERT INTO retention_protected (id) {_RULE}"))
    if conn.dialect.name == "postgresql":
        conn.execute(text("ANALYZE retention_protected"))  # temp tables are never auto-analyzed
    return int(conn.scalar(text("SELECT count(*) FROM retention_protected")) or 0)


def drop_protected(conn: Connection) -> None:
    conn.execute(text("DROP TABLE IF EXISTS retention_protected"))
