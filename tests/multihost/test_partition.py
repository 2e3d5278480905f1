"""A host is cut off from the head while its agents run, then comes back.

While the cable is down its workers cannot renew their leases: the sweeper restarts the
rollouts (attempt+1) and the other host runs them. When the cable is back the partitioned node's
stalled connections resume and it tries to finish its stale attempts (renew, commit the agent's
end); every such write is fenced by lease owner and attempt, so nothing of the stale attempt is
committed: no event from it after the cut, no sample, no evaluation, and the ledger is exactly
once.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import Event, EventKind, RolloutStatus
from polar_mq.models.base import utcnow
from tests.multihost.support import agents_calling_on, multihost, rollouts
from tests.reliability.support import wait_terminal, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]
PARTITION_S = 8.0


def test_partitioned_node_does_not_commit_stale_work(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    with multihost(pg_url, tmp_path, hosts=2) as mh:
        # the agents sleep through the partition, then make their second call and exit
        tasks = [{"instruction": f"t{i}", "sleep_s": PARTITION_S + 2, "calls": 2} for i in range(4)]
        ids = mh.submit(tasks)
        wait_until(
            lambda: agents_calling_on(mh, db_session_factory, ids, "h1")
            or agents_calling_on(mh, db_session_factory, ids, "h2"), 90,
            "an agent answered once",
        )  # fmt: skip
        cut = 1 if agents_calling_on(mh, db_session_factory, ids, "h1") else 2
        node = f"h{cut}"
        stale = {
            rid: r.attempt for rid, r in rollouts(db_session_factory, ids).items()
            if rid in agents_calling_on(mh, db_session_factory, ids, node)
        }  # fmt: skip
        cut_at = utcnow()
        mh.bed.partition(cut, PARTITION_S)
        wait_terminal(db_session_factory, ids, 150)
        # the stale agents have woken up and tried to finish by now; give their node the time
        # its stalled connections need to resume (TCP retransmission backoff) and be refused
        log = mh.bed.hosts[cut].stack.processes[-1].log_path
        wait_until(
            lambda: all(f"{rid}" in _lost_lines(log) for rid in stale), 60,
            "the partitioned node to find its stale attempts fenced off",
        )  # fmt: skip

        after = rollouts(db_session_factory, ids)
        assert {r.status for r in after.values()} == {RolloutStatus.COMPLETED}
        for rid, attempt in stale.items():
            assert after[rid].attempt > attempt, (rid, after[rid].attempt)
        with db_session_factory() as session:
            late = session.scalars(
                select(Event).where(
                    Event.rollout_id.in_([uuid.UUID(r) for r in stale]),
                    Event.at > cut_at,
                    Event.worker.like(f"{node}/%"),
                )
            ).all()
        for event in late:  # the node may have started other work after the partition
            if event.attempt == stale[str(event.rollout_id)]:  # only its runtime's removal
                assert event.kind == EventKind.RUNTIME_RELEASED, (event.kind, event.stage)
        ledger = mh.ledger(db_session_factory, ids)
        assert ledger.problems == [], ledger.problems
        print(f"\npartition {PARTITION_S:.0f} s: {len(stale)} stale attempts on {node} fenced; "
              f"{ledger.summary()}")  # fmt: skip


def _lost_lines(log: Path) -> str:
    """The node's log lines that say a stage found its lease gone."""
    lines = log.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if "lease" in line.lower())
