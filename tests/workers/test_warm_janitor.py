"""The node janitor and the warm pool: idle and in-use pooled runtimes stay, unowned ones go."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import claim
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.runtimes import LocalRuntime
from polar_mq.runtimes.warm_pool import WarmPool, process_tag
from polar_mq.spec import RuntimeSpec
from polar_mq.workers.janitor import NodeJanitor

SPEC = RuntimeSpec.model_validate(
    {"kind": "local", "warm": True, "prepare": {"commands": ["echo warm > w.txt"]}}
)


def _rollouts(factory: sessionmaker[Session], n: int) -> list[uuid.UUID]:
    job = JobCreate.model_validate({"tasks": [{"instruction": "x"}], "samples_per_task": n})
    with unit_of_work(factory) as session:
        return list(create_job(session, job, "p").rollout_ids)


def _dead_process_tag() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    tag = process_tag(proc.pid)
    proc.wait()
    return tag


def test_janitor_keeps_idle_and_taken_and_removes_unowned(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    root = tmp_path / "rt"
    pool = WarmPool(root)
    live, finished = _rollouts(db_session_factory, 2)
    with unit_of_work(db_session_factory) as session:
        claim(session, Stage.PREPARE, live, "w1", 60)  # preparing: runtime id not stored yet
    idle = pool.fill_one(SPEC)
    just_taken = pool.cold(SPEC, f"{live.hex}-1", 30).runtime.runtime_id
    used = pool.cold(SPEC, f"{finished.hex}-1", 30).runtime
    used.exec("sleep 300 &")  # a process its agent left behind
    with unit_of_work(db_session_factory) as session:
        session.execute(
            update(Rollout).where(Rollout.id == finished).values(status=RolloutStatus.COMPLETED)
        )
    stale_attempt = pool.cold(SPEC, f"{live.hex}-0", 30).runtime.runtime_id
    half_built = pool.new_id("0" * 12)  # its builder was killed -9 mid-build
    (pool.base / "busy").mkdir(parents=True, exist_ok=True)
    (pool.base / "busy" / f"{half_built}@{_dead_process_tag()}").touch()
    LocalRuntime(half_built, root).start()
    building = pool.new_id("1" * 12)  # being built by a live process (this one)
    (pool.base / "busy" / f"{building}@{process_tag()}").touch()
    LocalRuntime(building, root).start()
    unmarked = pool.new_id("2" * 12)  # no marker at all: nobody owns it
    LocalRuntime(unmarked, root).start()

    janitor = NodeJanitor(root, db_session_factory)
    first = janitor.sweep_once()
    assert sorted(first) == sorted([used.runtime_id, stale_attempt, half_built])
    assert not used.alive_processes()
    assert (root / unmarked).exists()  # one sweep without a marker is not enough
    second = janitor.sweep_once()
    assert second == [unmarked]
    kept = sorted(p.name for p in root.iterdir() if p.name != ".warm")
    assert kept == sorted([idle, just_taken, building])
    assert janitor.sweep_once() == []

    states = {m.runtime_id: m.state for m in pool.markers()}
    assert states == {idle: "idle", just_taken: "taken", building: "busy"}
    pool.release(pool.handle(SPEC, just_taken), f"{live.hex}-1", reuse=False)
    pool.reap_idle(-1)
    LocalRuntime(building, root).stop()
    (pool.base / "busy" / f"{building}@{process_tag()}").unlink()
    assert sorted(p.name for p in root.iterdir()) == [".warm"]
