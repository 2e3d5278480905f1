"""Retention at scale: prune time, table size and read-query p99 before and after a prune.

    .venv/bin/python -m bench.retention [--calls 10000000] [--days 60] [--keep-days 30]
        [--export DIR] [--skip-write-path]

1. Write path (A/B, interleaved, median of 5): rows/s of the proxy's batch INSERT into a plain
   `llm_calls` (a database at migration 0008) and into the partitioned one (head).
2. A fresh database (head) gets `--calls` synthetic calls over `--days` days
   (`bench/retention/synthetic.py`); then the read queries (`measure.py`) are timed, the calls
   older than `--keep-days` are pruned (`polar_mq.retention.prune`, exporting to `--export` if
   given), and the queries timed again. Sizes are pg_total_relation_size over every partition.

Every database is dropped at the end. Figures also go to bench/results/retention.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.retention import measure, synthetic
from polar_mq.infra.db import create_db_engine
from polar_mq.infra.migrate import upgrade
from polar_mq.retention.prune import prune, table_bytes

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
RESULTS = Path(__file__).resolve().parent.parent / "results" / "retention.json"


@contextlib.contextmanager
def database(revision: str = "head") -> Iterator[str]:
    name = f"polar_mq_bench_retention_{uuid.uuid4().hex[:8]}"
    admin = create_db_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", pool_size=1)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
        upgrade(url, revision)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def write_path(repeats: int = 5) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"plain": [], "partitioned": []}
    with database("0008_tenants") as plain_url, database() as part_url:
        engines = {"plain": create_db_engine(plain_url), "partitioned": create_db_engine(part_url)}
        for engine in engines.values():
            measure.insert_rate(engine, batches=5)  # warm-up
        for _ in range(repeats):
            for name, engine in engines.items():
                rates[name].append(measure.insert_rate(engine))
        for engine in engines.values():
            engine.dispose()
    medians = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "rows_per_s": medians,
        "runs": rates,
        "ratio": medians["partitioned"] / medians["plain"],
    }


def scale(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": args.calls, "days": args.days, "keep_days": args.keep_days}
    with database() as url:
        engine = create_db_engine(url)
        try:
            print(f"generating {args.calls:,} calls over {args.days} days ...", flush=True)
            out["generate"] = synthetic.generate(engine, args.calls, args.days, scale=args.scale)
            picked = measure.targets(engine, args.keep_days - 2, args.samples)
            with engine.connect() as conn:
                out["rows_before"] = conn.scalar(text("SELECT count(*) FROM llm_calls"))
                out["bytes_before"] = table_bytes(conn)
            out["reads_before"] = measure.read_queries(engine, picked)
            cutoff = datetime.now(UTC) - timedelta(days=args.keep_days)
            print(f"pruning calls before {cutoff:%Y-%m-%d %H:%M} ...", flush=True)
            report = prune(engine, cutoff, export_dir=args.export)
            out["prune"] = {
                "seconds": report.seconds, "rows_deleted": report.rows_deleted,
                "rows_kept": report.rows_kept, "rows_exported": report.rows_exported,
                "partitions_dropped": len(report.partitions_dropped),
                "partitions_trimmed": report.partitions_trimmed,
            }  # fmt: skip
            with engine.connect() as conn:
                out["rows_after"] = conn.scalar(text("SELECT count(*) FROM llm_calls"))
                out["bytes_after"] = table_bytes(conn)
            out["reads_after"] = measure.read_queries(engine, picked)
        finally:
            engine.dispose()
    return out


def report(figures: dict[str, Any]) -> None:
    if "write_path" in figures:
        w = figures["write_path"]
        print("\nproxy batch INSERT (256 rows/batch, median of 5)")
        print(f"  plain table        {w['rows_per_s']['plain']:>10,.0f} rows/s")
        print(f"  partitioned        {w['rows_per_s']['partitioned']:>10,.0f} rows/s")
        print(f"  ratio              {w['ratio']:>10.2f}")
    s = figures["scale"]
    gb = 1 << 30
    print(f"\n{s['calls']:,} calls over {s['days']} days, keep {s['keep_days']} days")
    print(f"  generate           {sum(s['generate'].values()):>10.1f} s  {s['generate']}")
    p = s["prune"]
    print(f"  prune              {p['seconds']:>10.2f} s  ({p['partitions_dropped']} partitions "
          f"dropped, trimmed {p['partitions_trimmed']})")  # fmt: skip
    print(f"  rows               {s['rows_before']:>12,} -> {s['rows_after']:,} "
          f"({p['rows_deleted']:,} deleted, {p['rows_kept']:,} kept: running job, "
          f"{p['rows_exported']:,} exported)")  # fmt: skip
    ratio = s["bytes_after"] / s["bytes_before"]
    print(f"  size               {s['bytes_before'] / gb:>10.2f} GiB -> "
          f"{s['bytes_after'] / gb:.2f} GiB (x{ratio:.2f})")  # fmt: skip
    print(f"  {'query':<18} {'p50 before':>11} {'p50 after':>10} {'p99 before':>11} "
          f"{'p99 after':>10} {'p99 ratio':>10}")  # fmt: skip
    for name, before in s["reads_before"].items():
        after = s["reads_after"][name]
        print(f"  {name:<18} {before['p50_ms']:>9.2f}ms {after['p50_ms']:>8.2f}ms "
              f"{before['p99_ms']:>9.2f}ms {after['p99_ms']:>8.2f}ms "
              f"{after['p99_ms'] / before['p99_ms']:>10.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--keep-days", type=int, default=30)
    parser.add_argument("--scale", type=int, default=1, help="payload size multiplier")
    parser.add_argument("--samples", type=int, default=200, help="queries timed per kind")
    parser.add_argument("--export", type=Path, default=None, help="export pruned calls here")
    parser.add_argument("--skip-write-path", action="store_true")
    args = parser.parse_args()
    # A TERM (or an INT ignored by a background shell) must still drop the databases: exit
    # through the `finally` blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    figures: dict[str, Any] = {}
    if not args.skip_write_path:
        figures["write_path"] = write_path()
    figures["scale"] = scale(args)
    report(figures)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2, default=str))
    print(f"\nfigures: {RESULTS}")
