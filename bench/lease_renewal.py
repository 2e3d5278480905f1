"""A lease keeper's renewal round with N live sessions: one UPDATE per lease against one batch.

    .venv/bin/python -m bench.lease_renewal [--sizes 64,256,1024] [--repeats 9]

A stage process's lease keeper renews every lease it holds each `lease_s / 3`
(`polar_mq.workers.leases`). With a thousand live agent sessions in one run-agent process that
was a thousand UPDATEs, a round trip each; `transitions.renew_leases` makes it one statement. This
measures one renewal round, the way the keeper runs it (one transaction), both ways on the same
rollouts in the same run: N rollouts of a fresh, migrated database are claimed (each then holds a
lease, as a running stage does), then rounds alternate single, batch, batch, single, … and the
medians of wall time and of this process's CPU time are printed with their ratio. Both must
extend all N leases (checked each round). PostgreSQL only (SQLite keeps the single renewals).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from bench.pipeline.infra import fresh_database
from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed, Hold, claim, renew_lease, renew_leases
from polar_mq.models import RolloutStatus
from polar_mq.models.base import utcnow

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
Renewal = Callable[[Session, list[Hold]], int]


def held_rollouts(factory: sessionmaker[Session], n: int) -> list[Hold]:
    """`n` rollouts claimed for prepare (each with a live lease), as (rollout, busy, owner)."""
    spec = JobCreate.model_validate({"tasks": [{"instruction": f"t{i}"} for i in range(n)]})
    with unit_of_work(factory) as session:
        ids = create_job(session, spec, "bench").rollout_ids
    holds: list[Hold] = []
    for rid in ids:
        with unit_of_work(factory) as session:
            won = claim(session, Stage.PREPARE, rid, "bench-keeper", 600)
        assert isinstance(won, Claimed), won
        holds.append((rid, RolloutStatus.PREPARING, "bench-keeper"))
    return holds


def single(session: Session, holds: list[Hold]) -> int:
    """The keeper before the batch: one UPDATE (and round trip) per lease."""
    expires = utcnow() + timedelta(seconds=600)
    return sum(renew_lease(session, *hold, expires) for hold in holds)


def batch(session: Session, holds: list[Hold]) -> int:
    """The keeper now: one statement for every lease of the process."""
    return len(renew_leases(session, holds, utcnow() + timedelta(seconds=600)))


def one_round(
    factory: sessionmaker[Session], holds: list[Hold], renew: Renewal
) -> tuple[float, float]:
    """One renewal round in its own transaction, as the keeper runs it: (wall ms, CPU ms)."""
    wall, cpu = time.perf_counter(), time.process_time()
    with factory() as session, session.begin():
        extended = renew(session, holds)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if extended != len(holds):
        raise SystemExit(f"{renew.__name__} extended {extended} of {len(holds)} leases")
    return wall * 1000, cpu * 1000


def measure(
    factory: sessionmaker[Session], n: int, repeats: int
) -> dict[str, list[tuple[float, float]]]:
    holds = held_rollouts(factory, n)
    runs: dict[str, list[tuple[float, float]]] = {"single": [], "batch": []}
    ways: dict[str, Renewal] = {"single": single, "batch": batch}
    one_round(factory, holds, single)  # warm: connection, statement caches
    one_round(factory, holds, batch)
    for i in range(repeats):
        for name in ("single", "batch") if i % 2 == 0 else ("batch", "single"):
            runs[name].append(one_round(factory, holds, ways[name]))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64,256,1024", help="live sessions (leases) per process")
    p.add_argument("--repeats", type=int, default=9, help="rounds of each way per size")
    p.add_argument("--pg-admin-url", default=DEFAULT_PG)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'leases':>7} {'single ms':>10} {'batch ms':>9} {'wall x':>7} "
          f"{'single CPU ms':>14} {'batch CPU ms':>13} {'CPU x':>6}")  # fmt: skip
    with fresh_database(args.pg_admin_url, prefix="polar_mq_bench_leases") as (url, _name):
        engine = create_db_engine(url)
        try:
            factory = make_session_factory(engine)
            for n in sizes:
                runs = measure(factory, n, args.repeats)
                s_wall, s_cpu = (statistics.median(v) for v in zip(*runs["single"], strict=True))
                b_wall, b_cpu = (statistics.median(v) for v in zip(*runs["batch"], strict=True))
                wall = f"{s_wall:>10.1f} {b_wall:>9.2f} {s_wall / b_wall:>7.1f}"
                cpu = f"{s_cpu:>14.1f} {b_cpu:>13.2f} {s_cpu / b_cpu:>6.1f}"
                print(f"{n:>7} {wall} {cpu}", flush=True)
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
