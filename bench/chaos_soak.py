"""Chaos soak on the namespace bed: rollouts across hosts while faults land at random, then the
exactly-once ledger (`polar_mq.testing.ledger`).

    sudo .venv/bin/python -m bench.chaos_soak --rollouts 2000 --hosts 3 --broker redis

The head (root namespace) runs the fake engine, the proxy, the API and the sweeper; each host
runs one `polar-mq worker` node. PostgreSQL, Redis and the broker are the soak's own
(`chaos_services`: a private cluster and private broker processes on free ports), so restarting
them hits no other user of the machine. The faults follow a plan shuffled by `--seed` and fired
one every `--fault-every` seconds (issue 37's quota by default):

- `--kills-each` kill -9 of each process kind: a stage worker's Celery main process on a host,
  for each stage (its supervisor starts another), a node supervisor (restarted, its old process
  group stopped as a service manager would), and the head's API, proxy and sweeper (started
  again);
- `--host-kills` host kills (every process in its namespace; the host boots again
  `--reboot-after` s later) and `--partitions` partitions of one host for `--partition-s`;
- `--broker-restarts` broker restarts (Redis or RabbitMQ, SIGKILL then start) and
  `--pg-restarts` PostgreSQL restarts (`pg_ctl restart -m immediate`).

A fault that cannot land now (no second host up, the process not there yet) goes back into the
plan. At the end every host is up and connected, the runtime roots must empty (janitors), and
the ledger is printed with the throughput; `--no-faults` gives the baseline of the same workload.
Needs root (network namespaces). Figures: docs/multihost.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from bench.chaos_services import PrivateBroker, PrivatePostgres, PrivateRedis
from bench.pipeline.infra import fresh_database, stack_settings
from polar_mq.client import Client
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.infra.ports import free_port
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.stack.devstack import LocalStack
from polar_mq.testing import ledger
from polar_mq.testing.netns_bed import NetnsBed
from polar_mq.workers.janitor import local_runtime_ids

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "tests" / "reliability" / "agent_script.py"
"""A stdlib agent that logs every call it saw answered (the ledger's `calls seen`)."""
NODE = {Stage.PREPARE: 4, Stage.RUN_AGENT: 8, Stage.BUILD: 2, Stage.EVALUATE: 2}
HEAD_KINDS = ("api", "proxy", "sweeper")
RECOVERY: dict[str, Any] = {
    "lease_s": 3.0, "sweep_interval_s": 1.0, "republish_after_s": 5.0, "retry_backoff_s": 0.2,
}  # fmt: skip
"""Small recovery timeouts, so each fault costs seconds (production: a 60 s lease)."""


class Chaos:
    """The fault loop (a thread) and what it did."""

    def __init__(
        self,
        bed: NetnsBed,
        head: LocalStack,
        args: argparse.Namespace,
        broker: PrivateBroker,
        postgres: PrivatePostgres,
    ) -> None:
        self.bed, self.head, self.args = bed, head, args
        self.broker, self.postgres = broker, postgres
        self.rng = random.Random(args.seed)
        self.plan = self._plan()
        self.done: Counter[str] = Counter()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.down: set[int] = set()
        """Hosts killed or cut off right now (the other faults leave them alone)."""

    def _plan(self) -> list[str]:
        kinds = [*HEAD_KINDS, "supervisor", *(f"stage:{s.value}" for s in Stage)]
        args = self.args
        plan = [k for k in kinds for _ in range(args.kills_each)]
        plan += ["host"] * args.host_kills + ["partition"] * args.partitions
        plan += ["broker"] * args.broker_restarts + ["postgres"] * args.pg_restarts
        self.rng.shuffle(plan)
        return plan

    def run(self) -> None:
        while self.plan and not self.stop.wait(self.args.fault_every):
            kind = self.plan.pop(0)
            try:
                landed = self.one(kind)
            except Exception as exc:  # a fault that raced a recovery: report, try it later
                print(f"  fault {kind} failed: {exc!r}", flush=True)
                landed = False
            if landed:
                self.done[kind] += 1
                print(f"  {time.strftime('%H:%M:%S')} fault: {kind}", flush=True)
            else:
                self.plan.insert(min(len(self.plan), 2), kind)

    def one(self, kind: str) -> bool:
        up = [i for i in self.bed.hosts if i not in self.down]
        if kind.startswith("stage:"):
            return bool(up) and self._kill_stage(self.rng.choice(up), Stage(kind[6:]))
        if kind == "supervisor":
            return bool(up) and self._kill_supervisor(self.rng.choice(up))
        if kind in HEAD_KINDS:
            self._kill_head(kind)
            return True
        if kind == "broker":
            self.broker.restart()
            return True
        if kind == "postgres":
            self.postgres.restart()
            return True
        if len(up) < 2:  # never take the last host away
            return False
        index = self.rng.choice(up)
        self.down.add(index)
        if kind == "host":
            self.bed.kill_host(index)
            self._later(self.args.reboot_after, lambda: self._reboot(index))
        else:
            self.bed.cut(index)
            self._later(self.args.partition_s, lambda: self._heal(index))
        return True

    def _later(self, seconds: float, action: Any) -> None:
        threading.Timer(seconds, action).start()

    def _reboot(self, index: int) -> None:
        with self.lock:
            self.bed.start_node(index, NODE)
            self.down.discard(index)

    def _heal(self, index: int) -> None:
        self.bed.heal(index)
        self.down.discard(index)

    def _kill_stage(self, index: int, stage: Stage) -> bool:
        for pid in self.bed.processes(index):
            with contextlib.suppress(psutil.Error):
                command = " ".join(psutil.Process(pid).cmdline())
                if "celery" in command and f"-n {stage.value}." in command:
                    os.kill(pid, signal.SIGKILL)
                    return True
        return False

    def _kill_supervisor(self, index: int) -> bool:
        node = self.bed.hosts[index].node
        if node is None or not node.alive():
            return False
        os.kill(node.pid, signal.SIGKILL)
        time.sleep(1.0)
        node.stop(grace_s=5.0)  # its stage workers, as a service manager stops the unit's rest
        with self.lock:
            self.bed.start_node(index, NODE)
        return True

    def _kill_head(self, kind: str) -> None:
        procs = [p for p in self.head.processes if p.name == kind and p.alive()]
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
            proc.stop(grace_s=2.0)
            self.head.processes.remove(proc)
        getattr(self.head, kind)(**({} if kind == "sweeper" else {"wait": False}))

    def settle(self) -> None:
        """Stop injecting; bring every host back up and connected."""
        self.stop.set()
        time.sleep(max(self.args.partition_s, self.args.reboot_after) + 1)
        for index, host in self.bed.hosts.items():
            self.bed.heal(index)
            if host.node is None or not host.node.alive():
                self._reboot(index)


def _statuses(factory: Any, ids: list[uuid.UUID]) -> Counter[str] | None:
    """The rollouts' statuses; None while the database is away (a PostgreSQL restart)."""
    try:
        with factory() as session:
            rows = session.scalars(select(Rollout.status).where(Rollout.id.in_(ids))).all()
    except OperationalError:
        return None
    return Counter(rows)


def soak(
    args: argparse.Namespace,
    db_url: str,
    workdir: Path,
    tag: str,
    broker: PrivateBroker,
    postgres: PrivatePostgres,
) -> int:
    upstream = free_port()
    settings = stack_settings(
        tag, db_url, broker.url, workdir, upstream, proxy_redis_url=broker.redis.url, **RECOVERY,
    )  # fmt: skip
    call_log = workdir / "calls"
    call_log.mkdir()
    factory = make_session_factory(create_db_engine(db_url))
    with NetnsBed(workdir, args.hosts) as bed:
        head_settings = bed.head_settings(settings)
        with LocalStack(head_settings, workdir / "logs" / "head") as head:
            head.fake_upstream(upstream, wait=False, ttft_ms=20, token_delay_ms=2)
            head.proxy(wait=False)
            head.api(wait=False)
            head.sweeper()
            for index in range(1, args.hosts + 1):
                bed.start_node(index, NODE)
            head.wait_ready()
            client = Client(f"http://{head_settings.api_host}:{head_settings.api_port}")
            tasks = [
                {"instruction": f"task {i}", "calls": 3, "sleep_s": args.agent_sleep}
                for i in range(args.rollouts // args.group)
            ]
            harness = {"type": "command", "command": f"{sys.executable} {AGENT}",
                       "env": {"REL_CALL_LOG": str(call_log)}}  # fmt: skip
            started = time.monotonic()
            job = client.submit(
                tasks, samples_per_task=args.group, evaluator="completed", harness=harness,
                timeouts={"agent_s": 120}, retries={"max_attempts": 10},
            )  # fmt: skip
            ids = [uuid.UUID(str(r)) for r in job.rollout_ids]
            chaos = Chaos(bed, head, args, broker, postgres)
            faults = threading.Thread(target=chaos.run, daemon=True)
            if not args.no_faults:
                faults.start()
            deadline = started + args.timeout
            while time.monotonic() < deadline:
                counts = _statuses(factory, ids)
                if counts is None:
                    time.sleep(1)
                    continue
                finished = sum(n for s, n in counts.items() if s in RolloutStatus.TERMINAL)
                if finished == len(ids):
                    break
                if not args.no_faults and finished >= args.faults_until * len(ids):
                    chaos.stop.set()
                print(f"  {time.strftime('%H:%M:%S')} {finished}/{len(ids)} {dict(counts)}",
                      flush=True)  # fmt: skip
                time.sleep(5)
            elapsed = time.monotonic() - started
            chaos.settle()
            roots = [h.runtime_root for h in bed.hosts.values()]
            end = time.monotonic() + 60
            while any(local_runtime_ids(r) for r in roots) and time.monotonic() < end:
                time.sleep(1)
            result = ledger.check(factory, [str(i) for i in ids], call_log, roots)
            node_procs = {i: len(bed.processes(i)) for i in bed.hosts}
    print(f"\nchaos soak: {args.rollouts} rollouts, {args.hosts} hosts, broker {args.broker}, "
          f"faults {'off' if args.no_faults else dict(sorted(chaos.done.items()))}")  # fmt: skip
    if chaos.plan and not args.no_faults:
        print(f"  faults not injected (the rollouts ended first): {Counter(chaos.plan)}")
    print(f"  all terminal after {elapsed:.1f} s: {len(ids) / elapsed:.2f} rollouts/s")
    print(f"  ledger: {result.summary()}")
    print(f"  processes per host at the end: {node_procs}")
    for problem in result.problems[:20]:
        print(f"  PROBLEM {problem}")
    return 1 if result.problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--broker", choices=("redis", "amqp"), default="redis")
    parser.add_argument("--group", type=int, default=4, help="samples per task")
    parser.add_argument("--agent-sleep", type=float, default=2.0, help="s between calls 1 and 2")
    parser.add_argument("--fault-every", type=float, default=8.0)
    parser.add_argument("--kills-each", type=int, default=5, help="kill -9 of each process kind")
    parser.add_argument("--host-kills", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--broker-restarts", type=int, default=1)
    parser.add_argument("--pg-restarts", type=int, default=1)
    parser.add_argument("--partition-s", type=float, default=30.0)
    parser.add_argument("--reboot-after", type=float, default=10.0)
    parser.add_argument("--faults-until", type=float, default=0.9,
                        help="stop injecting once this share of rollouts has ended")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-faults", action="store_true", help="the same workload, no faults")
    args = parser.parse_args(argv)
    if not NetnsBed.available():
        parser.error("needs root and iproute2 (network namespaces)")
    if args.rollouts < args.group:
        parser.error("--rollouts must be at least --group")
    workdir = Path(tempfile.mkdtemp(prefix="polar-mq-chaos-", dir="/tmp"))
    tag = uuid.uuid4().hex[:8]
    postgres = PrivatePostgres()
    redis = PrivateRedis(workdir / "logs" / "redis")
    broker = PrivateBroker(args.broker, redis, workdir)
    try:
        postgres.start()
        redis.start()
        broker.start()
        with fresh_database(postgres.admin_url, "polar_mq_chaos") as (db_url, _):
            return soak(args, db_url, workdir, tag, broker, postgres)
    finally:
        broker.stop()
        redis.stop()
        postgres.stop()
        print(f"  logs: {workdir / 'logs'}")


if __name__ == "__main__":
    sys.exit(main())
