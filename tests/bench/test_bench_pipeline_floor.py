"""bench/pipeline's floors: each step of an item claims it once and records it once in PostgreSQL
(a duplicate delivery finds it taken), and the runtime floor's directories and spawn happen."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, text

from bench.pipeline import floor
from tests.conftest import module_database

pg_url, pg_engine = module_database("polar_mq_floor")


def test_every_step_claims_and_finishes_once(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    floor.create_tables(pg_engine)
    items = floor.seed(pg_engine, 2)
    steps = floor.FloorSteps(pg_url, tmp_path)
    assert floor.unfinished(pg_engine, items) == (2, 2)
    for step in range(1, floor.LAST_STEP + 1):
        assert steps.run("durable", step, items[0])
        assert not steps.run("durable", step, items[0])  # delivered twice: claimed already
        if step == 2:
            assert not steps.run("durable", 4, items[1])  # out of order: not ready for step 4
    assert floor.unfinished(pg_engine, items) == (1, 1)  # the second item never ran
    with pg_engine.connect() as conn:
        kinds = conn.execute(
            text(f"SELECT step, kind FROM {floor.EVENTS} WHERE item = :i ORDER BY id"),
            {"i": items[0]},
        ).all()
    assert [tuple(k) for k in kinds] == [
        (s, kind) for s in range(1, 5) for kind in ("started", "finished")
    ]


def test_the_runtime_floor_makes_spawns_and_removes(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    floor.create_tables(pg_engine)
    (item,) = floor.seed(pg_engine, 1)
    steps = floor.FloorSteps(pg_url, tmp_path)
    here = tmp_path / "floor" / str(item)
    assert steps.run("runtime", 1, item)
    assert (here / "workspace" / "task.json").read_bytes() == floor.TASK_FILE
    assert sorted(p.name for p in here.iterdir()) == ["home", "tmp", "workspace"]
    for step in (2, 3, 4):
        assert steps.run("runtime", step, item)
    assert not here.exists()
    assert floor.unfinished(pg_engine, [item]) == (0, 0)
