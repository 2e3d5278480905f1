"""The fault-injection harness: a real stack with small recovery timeouts, and the invariants.

Every scenario runs real processes (fake vLLM-shaped upstream, proxy, API, one Celery worker per
stage, the sweeper and the node janitor) on real PostgreSQL and Redis, injects one fault, and ends
with `check_invariants`, which reads the database and the machine:

- every accepted rollout is in exactly one terminal state, reached by exactly one terminal event;
- no duplicate evaluation, samples only for the attempt that finished;
- every LLM call an agent saw answered is logged, once, under the attempt that made it;
- no runtime process and no runtime directory is left on the node.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import Client
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import (
    Evaluation,
    Event,
    EventKind,
    LlmCall,
    Rollout,
    RolloutStatus,
    TrajectorySample,
)
from polar_mq.runtimes.local import RUNTIME_TAG
from polar_mq.stack.devstack import LocalStack
from polar_mq.workers.janitor import local_runtime_ids
from tests.e2e.stack import e2e_settings

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("agent_script.py")

FAST_RECOVERY: dict[str, Any] = {
    "lease_s": 2.0,
    "sweep_interval_s": 0.5,
    "republish_after_s": 3.0,
    "retry_backoff_s": 0.2,
}
"""Injected small so that each recovery takes seconds (production: 60 s lease, 10 s sweeps)."""


@dataclass
class RelStack:
    stack: LocalStack
    client: Client
    call_log: Path
    workers: dict[Stage, ManagedProcess]

    @property
    def settings(self) -> Any:
        return self.stack.settings

    def start_workers(self, *stages: Stage, pool_impl: str = "threads") -> None:
        """One `polar-mq worker` supervisor for `stages` (default: all), as on a node."""
        stages = stages or tuple(Stage)
        (proc,) = self.stack.workers(stages, pool_impl=pool_impl, one_supervisor=True)
        self.workers.update(dict.fromkeys(stages, proc))

    def worker_main(self, stage: Stage, timeout_s: float = 30.0) -> psutil.Process:
        """The Celery main process of a stage (a child of its `polar-mq worker` supervisor)."""
        supervisor = psutil.Process(self.workers[stage].pid)
        found: list[psutil.Process] = []
        hostname = f"-n {stage.value}."  # StageWorker.argv: `-n <stage>.<pool>@<node>`

        def is_celery(proc: psutil.Process) -> bool:
            try:
                command = " ".join(proc.cmdline())
            except psutil.Error:  # gone, or a zombie its supervisor has not reaped yet
                return False
            return "celery" in command and hostname in command

        def celery_up() -> bool:
            found[:] = [c for c in supervisor.children(recursive=True) if is_celery(c)]
            return bool(found)

        wait_until(celery_up, timeout_s, f"the {stage} Celery worker")
        return found[0]

    def submit(self, tasks: list[dict[str, Any]], samples: int = 1, **job: Any) -> list[str]:
        job.setdefault("evaluator", "completed")
        job.setdefault("timeouts", {"agent_s": 60})
        job.setdefault("harness", {"type": "command", "command": agent_command()})
        job["harness"].setdefault("env", {})["REL_CALL_LOG"] = str(self.call_log)
        submitted = self.client.submit(tasks, samples_per_task=samples, **job)
        return [str(r) for r in submitted.rollout_ids]


def agent_command() -> str:
    return f"{sys.executable} {AGENT}"


@contextmanager
def rel_stack(
    pg_url: str,
    tmp: Path,
    *,
    workers: bool = True,
    fake: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Iterator[RelStack]:
    """The stack; `fake`: options of the fake engine (e.g. `max_model_len`), `overrides`:
    settings."""
    upstream = free_port()
    settings = e2e_settings(
        pg_url, tmp, upstream_url=f"http://127.0.0.1:{upstream}", served_model="fake-model",
        **{**FAST_RECOVERY, **overrides},
    )  # fmt: skip
    call_log = tmp / "calls"
    call_log.mkdir(parents=True, exist_ok=True)
    with LocalStack(settings, tmp / "logs", extra_env={"PYTHONPATH": str(REPO)}) as stack:
        stack.fake_upstream(upstream, wait=False, **(fake or {}))
        stack.proxy(wait=False)
        stack.api(wait=False)
        stack.sweeper()
        stack.janitor(interval_s=0.5)
        client = Client(f"http://{settings.api_host}:{settings.api_port}")
        rel = RelStack(stack, client, call_log, {})
        if workers:
            rel.start_workers()
        stack.wait_ready()  # the services boot side by side
        yield rel


def wait_until(
    predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1
) -> float:
    """Poll until `predicate()` is truthy; return the seconds it took, fail with `what`."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def statuses(factory: sessionmaker[Session], rollout_ids: list[str]) -> dict[str, str]:
    with factory() as session:
        rows = session.execute(
            select(Rollout.id, Rollout.status).where(
                Rollout.id.in_([uuid.UUID(r) for r in rollout_ids])
            )
        ).all()
    return {str(row.id): row.status for row in rows}


def all_terminal(factory: sessionmaker[Session], rollout_ids: list[str]) -> bool:
    found = statuses(factory, rollout_ids)
    return len(found) == len(rollout_ids) and all(
        s in RolloutStatus.TERMINAL for s in found.values()
    )


def wait_terminal(
    factory: sessionmaker[Session], rollout_ids: list[str], timeout_s: float = 90
) -> float:
    """Seconds until every rollout is terminal; a timeout names the statuses they were stuck in."""
    try:
        return wait_until(
            lambda: all_terminal(factory, rollout_ids), timeout_s, "terminal rollouts"
        )
    except AssertionError as exc:
        stuck = Counter(statuses(factory, rollout_ids).values())
        raise AssertionError(
            f"{exc}; rollouts by status: {dict(stuck)}\n{stuck_history(factory, rollout_ids)}"
        ) from None


def log_tails(stack: LocalStack, chars: int = 2000) -> str:
    """The end of every process log of a stack, for a failing scenario's message."""
    return "\n".join(f"--- {proc.name}\n{proc.log_tail(chars)}" for proc in stack.processes)


def stuck_history(factory: sessionmaker[Session], rollout_ids: list[str], last: int = 4) -> str:
    """Each unfinished rollout's status, attempt and last events: where a scenario that timed
    out left its rollouts (a CI run only keeps what the assertion says)."""
    lines = []
    with factory() as session:
        for rollout in session.scalars(
            select(Rollout).where(Rollout.id.in_([uuid.UUID(r) for r in rollout_ids]))
        ):
            if rollout.status in RolloutStatus.TERMINAL:
                continue
            events = session.scalars(
                select(Event).where(Event.rollout_id == rollout.id).order_by(Event.id.desc())
            ).all()[:last]
            trail = ", ".join(
                f"{e.at:%H:%M:%S} {e.stage}/{e.kind}#{e.attempt}" for e in reversed(events)
            )
            lines.append(f"  {rollout.id} {rollout.status} attempt {rollout.attempt}: {trail}")
    return "\n".join(lines)


def wait_status(
    factory: sessionmaker[Session], rollout_ids: list[str], status: str, timeout_s: float = 60
) -> float:
    return wait_until(
        lambda: set(statuses(factory, rollout_ids).values()) == {status},
        timeout_s,
        f"all rollouts {status}",
    )


def runtime_leftovers(root: Path) -> set[str]:
    """Runtime ids still present on the node (directories or tagged processes)."""
    return local_runtime_ids(root)


def tagged_processes(root: Path) -> list[int]:
    pids = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if RUNTIME_TAG in env and env.get("HOME", "").startswith(str(root)):
            pids.append(proc.pid)
    return pids


def agent_seen_calls(call_log: Path) -> list[tuple[str, str]]:
    seen = []
    for path in call_log.glob("*.txt"):
        for line in path.read_text().splitlines():
            rollout_id, response_id = line.split()
            seen.append((rollout_id, response_id))
    return seen


def check_invariants(
    rel: RelStack,
    factory: sessionmaker[Session],
    rollout_ids: list[str],
    expect: dict[str, str] | None = None,
    leftover_timeout_s: float = 20.0,
    per_call: bool = True,
) -> dict[str, Rollout]:
    """Assert the suite's invariants; return the rollouts by id. `expect`: id → status.

    With `per_call` (the default builder), the samples of a completed rollout's final attempt
    are exactly its calls of that attempt: nothing of a lost attempt is trained on.
    """
    ids = [uuid.UUID(r) for r in rollout_ids]
    terminal_kinds = (EventKind.FAILED, EventKind.CANCELLED)
    with factory() as session:
        rollouts = {
            str(r.id): r for r in session.scalars(select(Rollout).where(Rollout.id.in_(ids)))
        }
        assert len(rollouts) == len(ids), "an accepted rollout is missing"
        for rid, rollout in rollouts.items():
            assert rollout.status in RolloutStatus.TERMINAL, (rid, rollout.status)
            if expect and rid in expect:
                assert rollout.status == expect[rid], (rid, rollout.status, rollout.error)
        events = session.execute(
            select(Event.rollout_id, Event.kind, Event.stage).where(Event.rollout_id.in_(ids))
        ).all()
        ends = Counter(
            str(e.rollout_id)
            for e in events
            if e.kind in terminal_kinds or (e.kind == EventKind.FINISHED and e.stage == "evaluate")
        )
        assert all(ends[rid] == 1 for rid in rollouts), f"terminal events per rollout: {ends}"
        evaluations = Counter(
            str(rid)
            for rid in session.scalars(
                select(Evaluation.rollout_id).where(Evaluation.rollout_id.in_(ids))
            )
        )
        for rid, rollout in rollouts.items():
            wanted = 1 if rollout.status == RolloutStatus.COMPLETED else 0
            assert evaluations[rid] == wanted, (rid, rollout.status, evaluations[rid])
        sample_attempts = session.execute(
            select(TrajectorySample.rollout_id, TrajectorySample.attempt, func.count())
            .where(TrajectorySample.rollout_id.in_(ids))
            .group_by(TrajectorySample.rollout_id, TrajectorySample.attempt)
        ).all()
        for row in sample_attempts:
            rollout = rollouts[str(row.rollout_id)]
            if rollout.status == RolloutStatus.COMPLETED:
                assert row.attempt <= rollout.attempt
        calls = session.execute(
            select(
                LlmCall.rollout_id, LlmCall.response, LlmCall.attempt, LlmCall.status_code
            ).where(LlmCall.rollout_id.in_(ids))
        ).all()
        logged = Counter(
            (str(c.rollout_id), c.response.get("id") if c.response else None) for c in calls
        )
        for c in calls:
            assert c.attempt <= rollouts[str(c.rollout_id)].attempt
        samples_of_final = Counter(
            str(row.rollout_id)
            for row in sample_attempts
            for _ in range(row[2])
            if row.attempt == rollouts[str(row.rollout_id)].attempt
        )
        for rid, rollout in rollouts.items():
            if rollout.status == RolloutStatus.COMPLETED and per_call:
                final_calls = [
                    c for c in calls
                    if str(c.rollout_id) == rid and c.attempt == rollout.attempt
                    and c.status_code == 200
                ]  # fmt: skip
                assert samples_of_final[rid] == len(final_calls), (rid, rollout.attempt)
    for rollout_id, response_id in agent_seen_calls(rel.call_log):
        if rollout_id in rollouts:
            assert logged[(rollout_id, response_id)] == 1, (rollout_id, response_id)
    root = rel.settings.runtime_root
    wait_until(
        lambda: not runtime_leftovers(root) and not tagged_processes(root),
        leftover_timeout_s,
        f"no runtime left on the node (left: {runtime_leftovers(root)})",
    )
    return rollouts
