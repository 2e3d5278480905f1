"""The refiller sizes the pool to the free agent slots and the queued warm rollouts."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.harnesses.presets.install import install_dir
from polar_mq.harnesses.presets.registry import get_preset
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import claim, finish
from polar_mq.runtimes.warm_pool import pool_key
from polar_mq.spec import RuntimeSpec
from polar_mq.workers.warm_refiller import Refiller, share_out

RUNTIME = {"kind": "local", "warm": True, "prepare": {"commands": ["echo w > w.txt"]}}


def test_share_out_follows_demand() -> None:
    assert share_out(Counter({"a": 5, "b": 1}), 4) == {"a": 3, "b": 1}
    assert share_out(Counter({"a": 1}), 4) == {"a": 1}
    assert share_out(Counter({"a": 3, "b": 3}), 0) == {}


def _submit(
    factory: sessionmaker[Session],
    n: int,
    runtime: dict[str, object],
    harness: dict[str, object] | None = None,
) -> list:
    job = JobCreate.model_validate(
        {"tasks": [{"instruction": "x"}], "samples_per_task": n, "runtime": runtime}
        | ({"harness": harness} if harness else {})
    )
    with unit_of_work(factory) as session:
        return list(create_job(session, job, "p").rollout_ids)


def _wait_idle(refiller: Refiller, n: int) -> None:
    deadline = time.monotonic() + 20
    while refiller.pool.census().counts["idle"] < n or refiller._building:
        refiller._building = {f: k for f, k in refiller._building.items() if not f.done()}
        assert time.monotonic() < deadline, refiller.pool.census()
        time.sleep(0.05)


def test_refill_targets_free_agent_slots(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    settings = Settings(
        database_url="sqlite://", runtime_root=tmp_path / "rt", pool="p", node_name="n1",
        warm_pool_build_concurrency=4, warm_pool_max_per_node=3,
    )  # fmt: skip
    refiller = Refiller(settings, db_session_factory, agent_slots=3)
    assert refiller.step() == []  # no demand, nothing built
    _submit(db_session_factory, 2, {"kind": "local"})  # cold jobs are not warmed
    assert refiller.step() == []
    rollouts = _submit(db_session_factory, 10, RUNTIME)
    key = pool_key(RuntimeSpec.model_validate(RUNTIME))
    assert refiller.step() == [key] * 3  # three free agent slots
    _wait_idle(refiller, 3)
    assert refiller.step() == []  # full
    # one agent starts on this node: one slot fewer to cover
    with unit_of_work(db_session_factory) as session:
        won = claim(session, Stage.PREPARE, rollouts[0], "w", 60)
        assert not isinstance(won, str)
        finish(session, won, {"node": "n1"}, {}, {}, None)
    assert refiller.demand().free_slots == 2
    taken = refiller.pool.take(RuntimeSpec.model_validate(RUNTIME), f"{rollouts[0].hex}-1")
    assert taken is not None
    assert refiller.step() == []  # 2 idle cover 2 free slots; and the node is at its bound
    refiller.pool.release(taken.runtime, f"{rollouts[0].hex}-1", reuse=False)
    refiller.pool.reap_idle(-1)
    assert refiller.pool.census().total == 0
    refiller._executor.shutdown()


def test_a_preset_under_bwrap_is_prewarmed_with_its_install_bound(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    """A warm bwrap runtime for a preset job must see the preset's install (as a cold one does):
    the binds are part of what the refiller builds and of the pool key prepare takes by."""
    settings = Settings(database_url="sqlite://", runtime_root=tmp_path / "rt", pool="p",
                        harness_root=tmp_path / "harnesses")  # fmt: skip
    refiller = Refiller(settings, db_session_factory, agent_slots=2)
    runtime = {"kind": "bwrap", "warm": True, "network": "host"}
    _submit(db_session_factory, 1, runtime, {"type": "aider"})
    demand = refiller.demand()
    aider = get_preset("aider")
    assert aider is not None
    binds = (str(install_dir(settings.harness_root, "aider", aider.package.default_version)),)
    spec = RuntimeSpec.model_validate(runtime)
    key = pool_key(spec, binds)
    assert key != pool_key(spec) and dict(demand.pending) == {key: 1}
    assert demand.specs[key] == (spec, binds)
    refiller._executor.shutdown()
