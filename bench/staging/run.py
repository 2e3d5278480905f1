"""Orchestration: one database, one broker, real workers; (a), (b), (c) and the start latencies.

Defaults follow the issue: 4 agent slots, prepare 2 s, agent 4 s of LLM calls, evaluate 2 s.
(a) runs on stage workers with one prepare and one evaluate slot per agent slot (each slot can run
its rollout's every stage itself); (b) and (c) on a staged node whose prepare and evaluate pools
are sized to keep up with the agents on average (`ceil(slots * stage_s / agent_s)`), plus the
node's warm-pool refiller. (c) is timed after an untimed warm-up job of `slots` rollouts with the
same runtime spec, the way a trainer's second batch finds the node. Each worker set first runs
an untimed cold job of 4 rollouts, so no configuration pays for Celery's boot. (b') and (c')
repeat (b) and (c) on a node with fewer prepare slots (`--constrained-prepare`, default 1) than
its agents need at cold-start speed: what the warm pool's reuse is for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench.pipeline.infra import cleanup_redis, fresh_database, stack_settings
from bench.pipeline.measure import AGENT_CALLS
from bench.staging import latency
from bench.staging.measure import Run, Workload, sequential, staged
from polar_mq.infra.db import create_db_engine
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.lifecycle.stages import Stage
from polar_mq.runtimes.warm_pool import WarmPool
from polar_mq.stack.devstack import LocalStack

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
TARGET_UTILISATION = 0.90
TARGET_SPEEDUP = 1.8


@dataclass
class Options:
    slots: int
    rollouts: int
    prepare_s: float
    agent_s: float
    evaluate_s: float
    prepare_concurrency: int
    evaluate_concurrency: int
    latency_repeats: int
    constrained_prepare: int
    kinds: list[str]
    redis_url: str
    pg_admin_url: str
    keep_logs: bool


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.staging", description=__doc__)
    p.add_argument("--slots", type=int, default=4, help="agent slots (run_agent concurrency)")
    p.add_argument("--rollouts", type=int, default=64, help="rollouts per configuration")
    p.add_argument("--prepare-s", type=float, default=2.0)
    p.add_argument("--agent-s", type=float, default=4.0, help=f"over {AGENT_CALLS} LLM calls")
    p.add_argument("--evaluate-s", type=float, default=2.0)
    p.add_argument("--prepare-concurrency", type=int, default=None, help="(b)/(c) prepare slots")
    p.add_argument("--evaluate-concurrency", type=int, default=None, help="(b)/(c) eval slots")
    p.add_argument("--latency-repeats", type=int, default=5, help="0: skip the latency table")
    p.add_argument(
        "--constrained-prepare", type=int, default=1, help="(b')/(c') prepare slots; 0: skip them"
    )
    p.add_argument("--kinds", default="local,bwrap,docker")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/6")
    p.add_argument("--pg-admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--keep-logs", action="store_true")
    ns = p.parse_args(argv)
    if ns.slots < 1 or ns.rollouts < 4:
        p.error("--slots ≥ 1 and --rollouts ≥ 4")

    def sized(value: int | None, stage_s: float) -> int:
        return value or max(1, math.ceil(ns.slots * stage_s / ns.agent_s))

    return Options(
        slots=ns.slots,
        rollouts=-(-ns.rollouts // 4) * 4,
        prepare_s=ns.prepare_s,
        agent_s=ns.agent_s,
        evaluate_s=ns.evaluate_s,
        prepare_concurrency=sized(ns.prepare_concurrency, ns.prepare_s),
        evaluate_concurrency=sized(ns.evaluate_concurrency, ns.evaluate_s),
        latency_repeats=ns.latency_repeats,
        constrained_prepare=ns.constrained_prepare,
        kinds=[k.strip() for k in ns.kinds.split(",") if k.strip()],
        redis_url=ns.redis_url,
        pg_admin_url=ns.pg_admin_url,
        keep_logs=ns.keep_logs,
    )


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _swap_workers(
    local: LocalStack, old: list[ManagedProcess], counts: dict[Stage, int]
) -> list[ManagedProcess]:
    for proc in old:
        proc.stop()
        local.processes.remove(proc)
    return local.workers(concurrency=counts)


def _wait_pool(pool: WarmPool, idle: int, timeout_s: float = 60) -> int:
    """Until nothing is being built or recycled and `idle` runtimes are ready (or timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        census = pool.census()
        if census.counts["idle"] >= idle and not census.counts["busy"]:
            break
        time.sleep(0.1)
    return pool.census().counts["idle"]


def render(opts: Options, runs: list[Run], lat: list[dict[str, Any]], ctx: dict[str, Any]) -> str:
    a, b, c = runs[:3]
    lines = [
        f"bench.staging — {opts.slots} agent slots, {opts.rollouts} rollouts per configuration; "
        f"prepare {opts.prepare_s:g} s (recipe), agent {opts.agent_s:g} s "
        f"({AGENT_CALLS} LLM calls via proxy), evaluate {opts.evaluate_s:g} s (command in runtime)",
        f"(a) workers: prepare={opts.slots} run_agent={opts.slots} evaluate={opts.slots}; "
        f"(b)/(c): prepare={opts.prepare_concurrency} run_agent={opts.slots} "
        f"evaluate={opts.evaluate_concurrency}, + warm-pool refiller; "
        f"(c) pool idle at start: {ctx['pool_idle_at_c']}",
        f"(b')/(c'): the same with prepare={opts.constrained_prepare} (a node whose prepare "
        f"capacity is short of its agents'); (c') pool idle at start: "
        f"{ctx.get('pool_idle_at_c2', '-')}",
        "",
        f"{'configuration':<30} {'wall s':>8} {'rollouts/min':>13} {'slot busy':>10} "
        f"{'busy (agent window)':>20} {'vs (a)':>7} {'prepare med s':>14} {'runtimes':>16}",
    ]
    for run in runs:
        sources = ",".join(f"{k}:{v}" for k, v in sorted(run.runtime_sources.items()))
        lines.append(
            f"{run.name:<30} {run.wall_s:>8.1f} {run.per_minute:>13.1f} "
            f"{100 * run.utilisation:>9.1f}% {100 * run.utilisation_window:>19.1f}% "
            f"{run.per_minute / a.per_minute:>6.2f}x {run.stage_s.get('prepare', 0):>14.3f} "
            f"{sources:>16}"
        )
    ok_util = c.utilisation >= TARGET_UTILISATION
    ok_speed = c.per_minute / a.per_minute >= TARGET_SPEEDUP
    lines += [
        "",
        f"target (c) slot busy ≥ {TARGET_UTILISATION:.0%}: {100 * c.utilisation:.1f}% "
        f"{'meets' if ok_util else 'MISSES'}; (c)/(a) ≥ {TARGET_SPEEDUP}x: "
        f"{c.per_minute / a.per_minute:.2f}x {'meets' if ok_speed else 'MISSES'}; "
        f"(c)/(b) {c.per_minute / b.per_minute:.2f}x"
        + (f"; (c')/(b') {runs[4].per_minute / runs[3].per_minute:.2f}x" if len(runs) == 5 else ""),
        "slot busy = run-agent claim→commit time / (slots x wall, first submit → last terminal);"
        " agent window = first agent start → last agent end",
    ]
    if lat:
        lines += [
            "",
            "runtime start per backend (median of "
            f"{opts.latency_repeats}; cold = start + trivial recipe, warm = take incl. liveness):",
            f"{'backend':<8} {'cold ms':>9} {'warm ms':>9} {'cold/warm':>10} {'reset ms':>9} "
            f"{'teardown ms':>12}",
        ]
        for row in lat:
            if "skipped" in row:
                lines.append(f"{row['kind']:<8} skipped: {row['skipped']}")
                continue
            lines.append(
                f"{row['kind']:<8} {row['cold_start_ms']:>9.1f} {row['warm_take_ms']:>9.1f} "
                f"{row['speedup']:>9.1f}x {row['reset_ms']:>9.1f} {row['teardown_ms']:>12.1f}"
            )
    for run in runs:
        lines += [f"WARNING: {w}" for w in run.warnings]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tag = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-bench-staging-{tag}-"))
    started_at = datetime.now(UTC)
    wall0 = time.monotonic()
    ok = False
    print(f"bench.staging {tag}: logs in {tmp / 'logs'}", flush=True)
    work = Workload(opts.slots, opts.prepare_s, opts.agent_s, opts.evaluate_s)
    n = opts.rollouts
    timeout = 120 + n * (opts.prepare_s + opts.agent_s + opts.evaluate_s)
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(lambda: cleanup_redis(opts.redis_url, tag))
            db_url, db_name = stack.enter_context(fresh_database(opts.pg_admin_url))
            upstream = free_port()
            settings = stack_settings(
                tag, db_url, opts.redis_url, tmp, upstream, warm_pool_refill_interval_s=0.25
            )
            local = stack.enter_context(LocalStack(settings, tmp / "logs"))
            ttft_ms = 1000.0 * opts.agent_s / AGENT_CALLS
            local.fake_upstream(upstream, ttft_ms=ttft_ms)
            local.proxy()
            engine = create_db_engine(db_url, pool_size=2, max_overflow=2)
            stack.callback(engine.dispose)
            per_slot = {Stage.PREPARE: opts.slots, Stage.RUN_AGENT: opts.slots,
                        Stage.EVALUATE: opts.slots}  # fmt: skip
            workers = local.workers(concurrency=per_slot)
            print("warm-up (untimed: the workers boot) …", flush=True)
            staged(settings, engine, work, 4, False, timeout, "warm-up a")
            print(f"(a) sequential per slot, {n} rollouts …", flush=True)
            run_a = sequential(settings, engine, work, n, timeout)
            print(f"    {run_a.per_minute:.1f} rollouts/min", flush=True)

            workers = _swap_workers(
                local, workers,
                {Stage.PREPARE: opts.prepare_concurrency, Stage.RUN_AGENT: opts.slots,
                 Stage.EVALUATE: opts.evaluate_concurrency},
            )  # fmt: skip
            refiller = local.warm_pool(agent_slots=opts.slots)
            print("warm-up (untimed: the workers boot) …", flush=True)
            staged(settings, engine, work, 4, False, timeout, "warm-up b")
            print(f"(b) staged, no warm pool, {n} rollouts …", flush=True)
            run_b = staged(settings, engine, work, n, False, timeout, "(b) staged, cold")
            print(f"    {run_b.per_minute:.1f} rollouts/min", flush=True)
            print(f"(c) warm-up job ({opts.slots} rollouts, untimed) …", flush=True)
            pool = WarmPool(settings.runtime_root)
            staged(settings, engine, work, max(4, opts.slots), True, timeout, "warm-up")
            idle_at_c = _wait_pool(pool, opts.slots)
            print(f"(c) staged + warm pool (reuse), {n} rollouts; {idle_at_c} idle …", flush=True)
            run_c = staged(settings, engine, work, n, True, timeout, "(c) staged, warm pool")
            print(f"    {run_c.per_minute:.1f} rollouts/min", flush=True)
            runs = [run_a, run_b, run_c]
            idle_at_c2 = None
            if opts.constrained_prepare:
                workers = _swap_workers(
                    local, workers,
                    {Stage.PREPARE: opts.constrained_prepare, Stage.RUN_AGENT: opts.slots,
                     Stage.EVALUATE: opts.evaluate_concurrency},
                )  # fmt: skip
                print("warm-up (untimed: the workers boot) …", flush=True)
                staged(settings, engine, work, 4, False, timeout, "warm-up b'")
                p = opts.constrained_prepare
                print(f"(b') staged, prepare={p}, {n} rollouts …", flush=True)
                runs.append(
                    staged(settings, engine, work, n, False, timeout, f"(b') cold, prep={p}")
                )
                print(f"    {runs[-1].per_minute:.1f} rollouts/min", flush=True)
                idle_at_c2 = _wait_pool(pool, opts.slots)
                print(f"(c') staged + warm pool, prepare={p}; {idle_at_c2} idle …", flush=True)
                runs.append(
                    staged(settings, engine, work, n, True, timeout, f"(c') warm, prep={p}")
                )
                print(f"    {runs[-1].per_minute:.1f} rollouts/min", flush=True)
            _wait_pool(pool, 0)
            refiller.stop()  # drains the pool
            left = [
                p.name for p in settings.runtime_root.iterdir() if p.name not in ("logs", ".warm")
            ]
            lat: list[dict[str, Any]] = []
            if opts.latency_repeats > 0:
                print("runtime start latency per backend …", flush=True)
                for kind in opts.kinds:
                    lat.append(latency.measure(tmp / "latency", kind, opts.latency_repeats))
            ctx = {
                "tag": tag,
                "database": db_name,
                "pool_idle_at_c": idle_at_c,
                "pool_idle_at_c2": idle_at_c2,
                "runtimes_left_after_drain": left,
                "cpu_count": os.cpu_count(),
                "load_after": os.getloadavg(),
                "started_at": started_at.isoformat(),
                "measure_wall_s": round(time.monotonic() - wall0, 1),
            }
            print()
            print(render(opts, runs, lat, ctx))
            if left:
                print(f"WARNING: runtimes left after the pool was drained: {left}")
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            path = RESULTS_DIR / f"staging-{started_at:%Y%m%dT%H%M%S}.json"
            payload = {
                "options": {k: v for k, v in vars(opts).items()},
                "runs": [r.as_json() for r in runs],
                "latency": lat,
                "context": ctx,
            }
            path.write_text(json.dumps(payload, indent=2, default=str))
            print(f"\nresults: {path.relative_to(REPO_ROOT)}")
            ok = True
    except KeyboardInterrupt:
        ok = True
        print("\ninterrupted; everything stopped and removed", file=sys.stderr)
        return 130
    finally:
        if ok and not opts.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        elif not ok:
            print(f"process logs kept in {tmp / 'logs'}", file=sys.stderr)
    print(f"done in {time.monotonic() - wall0:.0f}s")
    return 0
