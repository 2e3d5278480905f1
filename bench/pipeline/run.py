"""Orchestration: one database, one broker, both sets of workers, interleaved repeats, a report."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import redis

from bench.pipeline import baseline, cpu, floor, profile, report
from bench.pipeline.infra import stack_settings
from bench.pipeline.measure import (
    AGENT_CALLS,
    NOOP_HARNESS,
    POSTGRES,
    REDIS,
    SPAWNED,
    FloorRun,
    Measurement,
    Timer,
    run_chains,
    run_pipeline,
    trivial_agent_harness,
)
from polar_mq.infra.db import create_db_engine
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.lifecycle.stages import Stage
from polar_mq.stack.devstack import LocalStack
from polar_mq.workers.launcher import DEFAULT_CONCURRENCY, parse_concurrency

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
DEFAULT_REDIS = "redis://127.0.0.1:6379/6"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
GROUP = 4  # samples per task: rollout counts are rounded up to a multiple of this


@dataclass
class Options:
    rollouts: int = 400
    chains: int = 400
    agent_rollouts: int = 128
    repeats: int = 3
    warmup: int = 16
    concurrency: dict[Stage, int] = field(default_factory=lambda: dict(DEFAULT_CONCURRENCY))
    pool_impl: str = "threads"
    redis_url: str = DEFAULT_REDIS
    pg_admin_url: str = DEFAULT_PG
    keep_logs: bool = False
    floors: bool = False
    profile_dir: Path | None = None
    results_dir: Path = RESULTS_DIR


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pipeline",
        description="Orchestration overhead and whole-system cost per rollout (SPEC §9).",
    )
    parser.add_argument("--rollouts", type=int, default=400, help="(2) no-op rollouts per run")
    parser.add_argument("--chains", type=int, default=400, help="(1) raw Celery chains per run")
    parser.add_argument(
        "--agent-rollouts", type=int, default=128, help="(3) trivial-agent rollouts per run (≥64)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of (1)(2)(3)")
    parser.add_argument("--warmup", type=int, default=16, help="untimed items before timing")
    parser.add_argument(
        "--concurrency",
        default=None,
        help="threads per stage/queue, e.g. run_agent=8 (default: polar_mq's worker defaults)",
    )
    parser.add_argument("--pool-impl", default="threads", choices=["threads", "prefork"])
    parser.add_argument("--redis-url", default=DEFAULT_REDIS, help="broker (own db number)")
    parser.add_argument("--pg-admin-url", default=DEFAULT_PG, help="server to create the db on")
    parser.add_argument("--keep-logs", action="store_true", help="keep process logs after a run")
    parser.add_argument(
        "--floors",
        action="store_true",
        help="also the raw chain plus a claim and a finish in PostgreSQL per step (durable), and "
        "plus workspace directories and a spawned `true` (runtime): bench.pipeline.floor",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="after the timed runs, one untimed run of each under py-spy; stacks to DIR",
    )
    ns = parser.parse_args(argv)
    for name in ("rollouts", "chains", "agent_rollouts", "repeats"):
        if getattr(ns, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be ≥ 1")

    def round_up(n: int) -> int:
        return -(-n // GROUP) * GROUP

    return Options(
        rollouts=round_up(ns.rollouts),
        chains=ns.chains,
        agent_rollouts=round_up(ns.agent_rollouts),
        repeats=ns.repeats,
        warmup=round_up(max(ns.warmup, GROUP)),
        concurrency=parse_concurrency(ns.concurrency),
        pool_impl=ns.pool_impl,
        redis_url=ns.redis_url,
        pg_admin_url=ns.pg_admin_url,
        keep_logs=ns.keep_logs,
        floors=ns.floors,
        profile_dir=ns.profile,
    )


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _stopping(processes: list[ManagedProcess]) -> Iterator[list[ManagedProcess]]:
    """Stop `processes` (and their process groups) on exit: SIGTERM all first, then wait."""
    try:
        yield processes
    finally:
        for proc in processes:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(processes):
            proc.stop()


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    # also when started in the background by a shell, which would leave SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tag = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-bench-pipeline-{tag}-"))
    started_at = datetime.now(UTC)
    load_before = os.getloadavg()
    ok = False
    wall0 = time.monotonic()
    print(f"bench.pipeline {tag}: logs in {tmp / 'logs'}", flush=True)
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(baseline_cleanup, opts.redis_url, tag)
            db_url, db_name = stack.enter_context(_fresh_database_announced(opts.pg_admin_url))
            upstream_port = free_port()
            settings = stack_settings(tag, db_url, opts.redis_url, tmp, upstream_port)
            local = stack.enter_context(LocalStack(settings, tmp / "logs"))
            print(
                "starting fake upstream, proxy, 4 stage workers, 4 baseline workers …", flush=True
            )
            upstream = local.fake_upstream(upstream_port)
            proxy = local.proxy()
            workers = local.workers(concurrency=opts.concurrency, pool_impl=opts.pool_impl)
            pythonpath = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            env = {**local.env, "PYTHONPATH": os.pathsep.join(pythonpath)}
            base_procs = stack.enter_context(_stopping([]))
            for name, argv_ in baseline.worker_argvs(settings, opts.concurrency, opts.pool_impl):
                base_procs.append(ManagedProcess(name, argv_, env, tmp / "logs").start())
            app = baseline.create_baseline_app(settings)
            stack.callback(app.close)
            client = redis.Redis.from_url(opts.redis_url)
            stack.callback(client.close)
            engine = create_db_engine(db_url, pool_size=2, max_overflow=0)
            stack.callback(engine.dispose)

            info = {
                REDIS: lambda: cpu.find_processes("redis-server"),
            }
            postgres = {POSTGRES: lambda: cpu.find_processes("postgres", f" {db_name} ")}
            chain_pids = {p.name: p.pid for p in base_procs}
            chain_timer = Timer(chain_pids, info)
            polar_pids = {p.name: p.pid for p in [proxy, *workers]}
            polar_timer = Timer(
                polar_pids,
                {
                    "fake-upstream": lambda: cpu.tree_cpu(upstream.pid),
                    SPAWNED: lambda: cpu.reaped_in_trees([w.pid for w in workers]),
                    **postgres,
                    **info,
                },
            )
            floor_timer = Timer(
                chain_pids,
                {
                    SPAWNED: lambda: cpu.reaped_in_trees([p.pid for p in base_procs]),
                    **postgres,
                    **info,
                },
            )
            if opts.floors:
                floor.create_tables(engine)
            agent = trivial_agent_harness()
            prefix = settings.queue_prefix

            def chains(n: int) -> Measurement:
                return run_chains(app, client, prefix, n, chain_timer, timeout_s=60 + n * 0.2)

            def floor_of(mode: str) -> Callable[[int], Measurement]:
                run = FloorRun(mode, engine)
                return lambda n: run_chains(
                    app, client, prefix, n, floor_timer, timeout_s=60 + n * 0.5, floor=run
                )

            def noop(n: int) -> Measurement:
                return run_pipeline(
                    settings, engine, "noop", n, NOOP_HARNESS, GROUP, polar_timer,
                    timeout_s=90 + n * 0.5,
                )  # fmt: skip

            def agents(n: int) -> Measurement:
                return run_pipeline(
                    settings, engine, "agent", n, agent, GROUP, polar_timer,
                    timeout_s=90 + n * 1.0, expect_calls=AGENT_CALLS,
                )  # fmt: skip

            kinds: list[tuple[str, Callable[[int], Measurement], int]] = [
                ("baseline", chains, opts.chains),
                *((mode, floor_of(mode), opts.chains) for mode in floor.MODES if opts.floors),
                ("noop", noop, opts.rollouts),
                ("agent", agents, opts.agent_rollouts),
            ]
            print(f"warm-up ({opts.warmup} of each: {', '.join(k for k, _, _ in kinds)}) …")
            for _, fn, _ in kinds:
                m = fn(opts.warmup)
                if m.warnings:
                    raise RuntimeError(f"warm-up failed: {m.warnings}")
            runs: dict[str, list[Measurement]] = {kind: [] for kind, _, _ in kinds}
            for i in range(opts.repeats):
                print(f"run {i + 1}/{opts.repeats}:", end=" ", flush=True)
                for kind, fn, n in kinds:
                    m = fn(n)
                    runs[kind].append(m)
                    print(f"{kind} {m.rate:.1f}/s", end="; " if kind != "agent" else "\n")
                    for w in m.warnings:
                        print(f"  WARNING: {w}", flush=True)
            profile_lines: list[str] = []
            if opts.profile_dir is not None:
                print("profiling one untimed run of (1), (2), (3) with py-spy …", flush=True)
                profiled = (
                    ("baseline", chains, opts.chains, chain_pids),
                    ("noop", noop, opts.rollouts, polar_pids),
                    ("agent", agents, opts.agent_rollouts, polar_pids),
                )
                for kind, fn, n, pids in profiled:
                    with profile.recording(opts.profile_dir, kind, pids) as outputs:
                        fn(n)
                    summaries = [profile.summarise(k, v) for k, v in outputs.items()]
                    timed = {
                        name: statistics.median(m.cpu_ms_per_item([name]) for m in runs[kind])
                        for name in pids
                    }
                    profile_lines += ["", *profile.render(kind, n, summaries, timed)]
            dead = [p.name for p in [*local.processes, *base_procs] if not p.alive()]
            ctx: dict[str, Any] = {
                "tag": tag,
                "database": db_name,
                "redis_url": opts.redis_url,
                "queue_prefix": prefix,
                "concurrency": {s.value: c for s, c in opts.concurrency.items()},
                "pool_impl": opts.pool_impl,
                "cpu_count": os.cpu_count(),
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "started_at": started_at.isoformat(),
                "python": sys.version.split()[0],
                "dead_processes": dead,
            }
            ctx["measure_wall_s"] = round(time.monotonic() - wall0, 1)
            text, data = report.render(opts, runs, ctx)
            print()
            print(text)
            if profile_lines:
                print("\n".join(profile_lines))
                print(f"raw py-spy stacks in {opts.profile_dir}")
            path = report.write_json(
                opts.results_dir, started_at, {**data, "context": ctx, "profile": profile_lines}
            )
            print(f"\nresults: {path.relative_to(REPO_ROOT)}")
            ok = True
            print("stopping processes, dropping the database …", flush=True)
    except KeyboardInterrupt:
        ok = True  # nothing to debug: drop the logs too
        print("\ninterrupted; everything stopped and removed", file=sys.stderr)
        return 130
    finally:
        if ok and not opts.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        elif not ok:
            print(f"process logs kept in {tmp / 'logs'}", file=sys.stderr)
    print(f"done in {time.monotonic() - wall0:.0f}s")
    return 0


@contextlib.contextmanager
def _fresh_database_announced(admin_url: str) -> Iterator[tuple[str, str]]:
    from bench.pipeline.infra import fresh_database

    with fresh_database(admin_url) as (url, name):
        print(f"database {name} created and migrated", flush=True)
        yield url, name


def baseline_cleanup(redis_url: str, tag: str) -> None:
    from bench.pipeline.infra import cleanup_redis

    with contextlib.suppress(redis.RedisError):
        cleanup_redis(redis_url, tag)
