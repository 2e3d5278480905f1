"""Floors under the pipeline ratio: the raw chain plus only what any durable staged design must do.

SPEC §9 and issue 16 compare polar_mq's four stages (no-op agent) with a raw Celery chain of four
no-op tasks. But a stage that keeps its state in PostgreSQL with exactly-once effects cannot do
less than claim its rollout (a compare-and-set with a lease owner, the `started` event) and
record its result (a fenced update with the `finished` event), each one statement; and a stage
pipeline that runs an agent in a workspace cannot do less than make and remove the workspace's
directories and spawn the agent. `python -m bench.pipeline --floors` measures both, in the same
workers as the raw chain (the baseline's tasks take a mode), interleaved with the rest:

- `durable`: each step claims its item and finishes it, one statement each (an UPDATE and an
  event INSERT in one CTE, prepared, autocommit; psycopg on a per-thread connection, no ORM);
- `runtime`: `durable`, and step 1 makes the workspace, home and tmp directories and writes a
  task file, step 2 spawns `true` in its own session and waits for it, step 4 removes the tree.

What polar_mq does beyond these (typed spec, runtime records, agent identity, tag scans, receipts,
metrics, logging) is its own cost; what the floors cost is the shape's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, text

MODES = ("durable", "runtime")
TABLE = "bench_floor"
EVENTS = "bench_floor_events"
DDL = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, stage int NOT NULL, "
    "owner text, lease_until timestamptz, detail jsonb NOT NULL DEFAULT '{}')",
    f"CREATE TABLE IF NOT EXISTS {EVENTS} (id bigserial PRIMARY KEY, item bigint NOT NULL, "
    "step int NOT NULL, kind text NOT NULL, at timestamptz NOT NULL DEFAULT now(), detail jsonb)",
    f"CREATE INDEX IF NOT EXISTS {EVENTS}_item ON {EVENTS} (item)",
)
# Step s claims an item at stage 2(s-1) (ready), holds it at 2s-1 (running), leaves it at 2s.
CLAIM = (
    f"WITH c AS (UPDATE {TABLE} SET stage = %(running)s, owner = %(owner)s, "
    "lease_until = now() + interval '300 seconds' "
    "WHERE id = %(id)s AND stage = %(ready)s RETURNING id, detail) "
    f"INSERT INTO {EVENTS} (item, step, kind) SELECT id, %(step)s, 'started' FROM c "
    "RETURNING item"
)
FINISH = (
    f"WITH f AS (UPDATE {TABLE} SET stage = %(done)s, owner = NULL, lease_until = NULL, "
    "detail = detail || %(detail)s::jsonb WHERE id = %(id)s AND owner = %(owner)s RETURNING id) "
    f"INSERT INTO {EVENTS} (item, step, kind, detail) "
    "SELECT id, %(step)s, 'finished', %(detail)s::jsonb FROM f RETURNING item"
)
TASK_FILE = b'{"instruction": "floor task"}'
LAST_STEP = 4


def create_tables(engine: Engine) -> None:
    with engine.begin() as conn:
        for statement in DDL:
            conn.execute(text(statement))


def seed(engine: Engine, n: int) -> list[int]:
    """`n` items ready for step 1, inserted before a timed run starts: their ids (from the
    table's sequence, so no two runs share one)."""
    with engine.begin() as conn:
        result = conn.execute(
            text(f"INSERT INTO {TABLE} (stage) SELECT 0 FROM generate_series(1, :n) RETURNING id"),
            {"n": n},
        )
        ids: list[int] = list(result.scalars())
        return sorted(ids)


def unfinished(engine: Engine, items: list[int]) -> tuple[int, int]:
    """(items not at the last stage, items without exactly two events per step)."""
    with engine.connect() as conn:
        behind: int = conn.execute(
            text(f"SELECT count(*) FROM {TABLE} WHERE id = ANY(:ids) AND stage <> :done"),
            {"ids": items, "done": 2 * LAST_STEP},
        ).scalar_one()
        odd: int = conn.execute(
            text(
                "SELECT count(*) FROM unnest(CAST(:ids AS bigint[])) AS i(item) WHERE "
                f"(SELECT count(*) FROM {EVENTS} AS e WHERE e.item = i.item) <> :events"
            ),
            {"ids": items, "events": 2 * LAST_STEP},
        ).scalar_one()
    return int(behind), int(odd)


class FloorSteps:
    """The worker side: one autocommit connection per pool thread, statements prepared."""

    def __init__(self, database_url: str, runtime_root: Path) -> None:
        self.conninfo = database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        self.root = runtime_root / "floor"
        self._local = threading.local()

    def _conn(self) -> psycopg.Connection[Any]:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(self.conninfo, autocommit=True)
            self._local.conn = conn
        return conn

    def run(self, mode: str, step: int, item: int) -> bool:
        """One step of one item; False when the claim found it taken (a duplicate)."""
        conn = self._conn()
        owner = f"{os.getpid()}-{threading.get_ident()}"
        params = {"id": item, "step": step, "owner": owner}
        claimed = conn.execute(
            CLAIM, {**params, "ready": 2 * (step - 1), "running": 2 * step - 1}, prepare=True
        ).fetchone()
        if claimed is None:
            return False
        if mode == "runtime":
            self._runtime_work(step, item)
        conn.execute(
            FINISH, {**params, "done": 2 * step, "detail": f'{{"step{step}": true}}'}, prepare=True
        ).fetchone()
        return True

    def _runtime_work(self, step: int, item: int) -> None:
        here = self.root / str(item)
        if step == 1:
            for name in ("workspace", "home", "tmp"):
                os.makedirs(here / name, exist_ok=True)
            (here / "workspace" / "task.json").write_bytes(TASK_FILE)
        elif step == 2:
            proc = subprocess.Popen(
                ["true"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=here / "workspace",
                start_new_session=True,
            )
            proc.communicate()
        elif step == LAST_STEP:
            shutil.rmtree(here, ignore_errors=True)
