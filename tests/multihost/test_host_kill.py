"""A host dies mid-run: every process in its namespace is SIGKILLed at once, no SIGTERM anywhere,
its runtime directories stay on disk. The sweeper sees the leases of its running agents expire,
and the stamps of the rollouts prepared on it and waiting in its run-agent queue
(`workers.waiting_leases`), and re-runs all of them on the surviving host with attempt+1: every
rollout completes while the dead host stays dead. When the host boots again its janitor
reclaims the runtimes of the attempts it lost, and the ledger is exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import RolloutStatus
from polar_mq.workers.janitor import local_runtime_ids
from tests.multihost.support import NODE, agents_calling_on, multihost, rollouts
from tests.reliability.support import wait_terminal, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.reliability]


def test_host_kill_mid_run_is_exactly_once(
    pg_url: str, tmp_path: Path, db_session_factory: sessionmaker[Session]
) -> None:
    with multihost(pg_url, tmp_path, hosts=2) as mh:
        tasks = [{"instruction": f"t{i}", "sleep_s": 6, "calls": 2} for i in range(6)]
        ids = mh.submit(tasks)
        wait_until(
            lambda: agents_calling_on(mh, db_session_factory, ids, "h1")
            or agents_calling_on(mh, db_session_factory, ids, "h2"), 90,
            "an agent answered once",
        )  # fmt: skip
        victim = 1 if agents_calling_on(mh, db_session_factory, ids, "h1") else 2
        survivor = f"h{3 - victim}"
        on_victim = agents_calling_on(mh, db_session_factory, ids, f"h{victim}")
        left = mh.bed.kill_host(victim)
        assert left, "the dead host's runtimes stay on its disk"
        assert not mh.bed.processes(victim), "nothing survives in the dead host's namespace"
        wait_terminal(db_session_factory, ids, 150)  # the dead host stays dead meanwhile
        after = rollouts(db_session_factory, ids)
        assert {r.status for r in after.values()} == {RolloutStatus.COMPLETED}
        assert {r.node for r in after.values()} == {survivor}, "the survivor ran everything"
        for rid in on_victim:
            assert after[rid].attempt >= 2, (rid, after[rid].attempt)
        # the dead host's runtimes are still on its disk until it comes back
        assert local_runtime_ids(mh.bed.hosts[victim].runtime_root) >= left

        mh.bed.start_node(victim, NODE)  # the host boots again: its janitor reclaims
        wait_until(
            lambda: not local_runtime_ids(mh.bed.hosts[victim].runtime_root), 60,
            "the rebooted janitor to reclaim the dead node's runtimes",
        )  # fmt: skip
        ledger = mh.ledger(db_session_factory, ids)
        assert ledger.problems == [], ledger.problems
        assert ledger.calls_seen > 0
        print(f"\nhost kill: {len(on_victim)} agents on h{victim}, {len(left)} runtimes left "
              f"and reclaimed; {ledger.summary()}")  # fmt: skip
