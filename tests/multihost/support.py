"""The multi-host stack: a head in the root namespace and nodes on namespace hosts (`netns_bed`).

The head runs the fake vLLM-shaped engine, the proxy (on the bridge address), the API and the
sweeper with the reliability suite's small recovery timeouts; each host runs one `polar-mq
worker` node (janitor on) reaching PostgreSQL and Redis through the bed's forwarder. Agents are
the reliability suite's `agent_script.py`, logging every call they saw answered.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import Client
from polar_mq.infra.ports import free_port
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Rollout
from polar_mq.stack.devstack import LocalStack
from polar_mq.testing import ledger
from polar_mq.testing.netns_bed import NetnsBed
from polar_mq.workers.janitor import local_runtime_ids
from tests.e2e.stack import e2e_settings
from tests.reliability.support import AGENT, FAST_RECOVERY

RELEASE_WAIT_S = 15.0
"""How long after the rollouts end a node may take to remove their runtimes."""
NODE = {Stage.PREPARE: 2, Stage.RUN_AGENT: 2, Stage.BUILD: 1, Stage.EVALUATE: 1}


@dataclass
class MultiHost:
    bed: NetnsBed
    head: LocalStack
    client: Client
    call_log: Path

    def submit(self, tasks: list[dict[str, Any]], samples: int = 1) -> list[str]:
        harness = {
            "type": "command",
            "command": f"{sys.executable} {AGENT}",
            "env": {"REL_CALL_LOG": str(self.call_log)},
        }
        job = self.client.submit(
            tasks, samples_per_task=samples, evaluator="completed", harness=harness,
            timeouts={"agent_s": 60},
        )  # fmt: skip
        return [str(r) for r in job.rollout_ids]

    def ledger(self, factory: sessionmaker[Session], ids: list[str]) -> ledger.Ledger:
        """The ledger once the nodes have had `RELEASE_WAIT_S` to remove the runtimes of the
        attempts that ended: a node removes one right after the rollout's terminal state is
        committed (`workers.runner`), so a check the moment the last rollout ends can see it
        (it once did). A runtime never removed still fails the ledger."""
        roots = [h.runtime_root for h in self.bed.hosts.values()]
        deadline = time.monotonic() + RELEASE_WAIT_S
        while any(local_runtime_ids(r) for r in roots) and time.monotonic() < deadline:
            time.sleep(0.2)
        return ledger.check(factory, ids, self.call_log, roots)


@contextmanager
def multihost(pg_url: str, tmp: Path, hosts: int = 2) -> Iterator[MultiHost]:
    """The bed and its head; nodes are started by the test (`bed.start_node`)."""
    upstream = free_port()
    base = e2e_settings(
        pg_url, tmp, upstream_url=f"http://127.0.0.1:{upstream}", served_model="fake-model",
        **FAST_RECOVERY,
    )  # fmt: skip
    call_log = tmp / "calls"
    call_log.mkdir(parents=True, exist_ok=True)
    with NetnsBed(tmp, hosts) as bed:
        settings = bed.head_settings(base)
        with LocalStack(settings, tmp / "logs" / "head") as head:
            head.fake_upstream(upstream, wait=False)
            head.proxy(wait=False)
            head.api(wait=False)
            head.sweeper()
            client = Client(f"http://{settings.api_host}:{settings.api_port}")
            for index in range(1, hosts + 1):
                bed.start_node(index, NODE)
            head.wait_ready()
            yield MultiHost(bed, head, client, call_log)


def rollouts(factory: sessionmaker[Session], ids: list[str]) -> dict[str, Rollout]:
    with factory() as session:
        found = session.scalars(select(Rollout).where(Rollout.id.in_([uuid.UUID(i) for i in ids])))
        return {str(r.id): r for r in found}


def agents_calling_on(mh: MultiHost, factory: sessionmaker[Session], ids: list[str], node: str
                      ) -> set[str]:  # fmt: skip
    """Rollouts running their agent on `node` whose agent has had a call answered."""
    called = {rid for rid, _ in ledger.seen_calls(mh.call_log)}
    return {
        rid for rid, r in rollouts(factory, ids).items()
        if r.node == node and r.status == "running" and rid in called
    }  # fmt: skip
