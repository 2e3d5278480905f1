"""Many live agent sessions on one node (issue 37, item 4), at a modest N.

One `polar-mq worker` node with run-agent concurrency 128, started as a service manager starts
it, with a soft open-file limit (512) below what 128 live sessions hold (five descriptors each in
the run-agent worker); a fake engine behind the real proxy; 128 agents (a shell script and curl)
that call, sleep, call, sleep, call. Every session must end completed with its three calls
stored, on its first attempt (none started over), and the node's PostgreSQL connections stay
within its pools' bound, which does not depend on the number of sessions.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import live_sessions
from polar_mq.lifecycle.stages import Stage

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SESSIONS = 128
POOL_PER_PROCESS = 4 + 8 + 1
"""A stage worker's stage pool (4 + 8 overflow, `workers.context`) and its lease keeper's own."""
NODE_DB_BOUND = len(Stage) * POOL_PER_PROCESS + 4
"""Every stage worker's pools, and a few of the supervisor's (drain and waiting-lease checks)."""


def test_128_live_sessions_none_lost_and_db_connections_bounded(tmp_path: Path) -> None:
    opts = live_sessions.Options(
        sizes=[SESSIONS],
        sleep_s=12.0,
        redis_url=os.environ.get("POLAR_MQ_TEST_REDIS", "redis://127.0.0.1:6379") + "/6",
        min_free_gib=0.0,
        nofile=512,
        results_dir=None,
    )
    (run,) = live_sessions.run(opts, tmp_path)

    assert run.warnings == []  # all completed, 3 calls each, none started over
    figures = run.figures
    assert figures["live"]["node_pg_connections"] <= NODE_DB_BOUND
    assert figures["peak_node_pg_connections"] <= NODE_DB_BOUND < SESSIONS
    # the agents held their sessions at once: the node's threads and descriptors grew with them
    assert figures["live"]["node_threads"] - figures["idle_node"]["node_threads"] >= SESSIONS // 2
