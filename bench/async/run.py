"""Orchestration: one database, one broker, real workers, the API; (a), then each staleness bound.

The workload is K training steps x B groups x G samples. Every rollout runs `bench/async/agent.py`
(2 to 4 chat calls through the real proxy to the vLLM-shaped fake upstream, which waits
`--call-ms` before each answer, so agent runs take ~1-2 s with the defaults; the number of calls
per task is drawn once from a seeded generator, so every configuration runs the same tasks). The
trainer (`trainer.py`) "trains" for `--train-s` per step and loads weights for `--load-s`.
All configurations run on the same processes, one after the other, after an untimed warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench.pipeline.infra import cleanup_redis, fresh_database, stack_settings
from polar_mq.client import Client
from polar_mq.infra.ports import free_port
from polar_mq.lifecycle.stages import Stage
from polar_mq.stack.devstack import LocalStack

from .trainer import LoopRun, run_async, run_sync

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
AGENT = Path(__file__).with_name("agent.py")
TURNS = (2, 3, 4)


@dataclass
class Options:
    steps: int
    batch_groups: int
    samples: int
    slots: int
    call_ms: float
    train_s: float
    load_s: float
    staleness: list[int]
    seed: int
    redis_url: str
    pg_admin_url: str
    keep_logs: bool
    quick: bool
    results_dir: Path


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.async", description=__doc__)
    p.add_argument("--steps", type=int, default=12, help="training steps K per configuration")
    p.add_argument("--batch-groups", type=int, default=4, help="groups per step B")
    p.add_argument("--samples", type=int, default=4, help="samples per group G")
    p.add_argument("--slots", type=int, default=None, help="agent slots (default B x G)")
    p.add_argument("--call-ms", type=float, default=500.0, help="fake engine latency per call")
    p.add_argument("--train-s", type=float, default=1.5, help="simulated optimizer step")
    p.add_argument("--load-s", type=float, default=0.3, help="simulated weight load")
    p.add_argument("--staleness", default="1,2", help="max_staleness of the async runs")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="smoke run: tiny workload, short waits")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/6")
    p.add_argument("--pg-admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.steps, ns.batch_groups, ns.samples = 3, 2, 2
        ns.call_ms, ns.train_s, ns.load_s = 100.0, 0.3, 0.05
    if min(ns.steps, ns.batch_groups, ns.samples) < 1:
        p.error("--steps, --batch-groups and --samples must be ≥ 1")
    try:
        staleness = [int(x) for x in ns.staleness.split(",") if x.strip()]
    except ValueError:
        p.error("--staleness: comma-separated integers")
    if any(s < 0 for s in staleness):
        p.error("--staleness: bounds must be ≥ 0")
    return Options(
        steps=ns.steps,
        batch_groups=ns.batch_groups,
        samples=ns.samples,
        slots=ns.slots or ns.batch_groups * ns.samples,
        call_ms=ns.call_ms,
        train_s=ns.train_s,
        load_s=ns.load_s,
        staleness=staleness,
        seed=ns.seed,
        redis_url=ns.redis_url,
        pg_admin_url=ns.pg_admin_url,
        keep_logs=ns.keep_logs,
        quick=ns.quick,
        results_dir=ns.results_dir,
    )


def workload(opts: Options) -> list[dict[str, Any]]:
    """K x B tasks; each names how many chat calls its agents make (the same in every run)."""
    rng = random.Random(opts.seed)
    return [
        {"instruction": f"async bench task {i}", "answer": "1", "turns": rng.choice(TURNS),
         "p_correct": round(rng.uniform(0.2, 0.8), 2)}
        for i in range(opts.steps * opts.batch_groups)
    ]  # fmt: skip


def job_spec(opts: Options, label: str) -> Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]]:
    command = f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(AGENT))}"

    def spec(tasks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {
            "tasks": [dict(t) for t in tasks],
            "samples_per_task": opts.samples,
            "harness": {"type": "command", "command": command},
            "runtime": {"kind": "local"},
            "evaluator": "exact_match",
            "builder": "per_call",
            "timeouts": {"agent_s": 120},
            "metadata": {"bench": "async", "label": label},
        }

    return spec


def _concurrency(slots: int) -> dict[Stage, int]:
    """Agent slots, and enough prepare/build/evaluate slots that they never hold the agents up."""
    side = max(2, slots // 4)
    return {Stage.RUN_AGENT: slots, Stage.PREPARE: side, Stage.BUILD: side, Stage.EVALUATE: side}


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _histogram(run: LoopRun) -> str:
    counts = run.staleness
    total = sum(counts.values()) or 1
    return "  ".join(f"{k}: {n} ({100 * n / total:.0f}%)" for k, n in sorted(counts.items()))


def render(opts: Options, runs: list[LoopRun], ctx: Mapping[str, Any]) -> str:
    base = runs[0]
    lines = [
        f"bench.async — {opts.steps} steps x {opts.batch_groups} groups x {opts.samples} samples;"
        f" {opts.slots} agent slots; agent = 2-4 chat calls x {opts.call_ms:g} ms (fake engine);"
        f" train {opts.train_s:g} s + weight load {opts.load_s:g} s per step",
        f"cpus {ctx['cpu_count']}, load average before {ctx['load_before'][0]:.2f}",
        "",
        f"{'configuration':<26} {'wall s':>7} {'steps':>6} {'groups':>7} {'step med s':>11} "
        f"{'groups/s':>9} {'samples/s':>10} {'waiting':>8} {'speedup':>8} {'step ratio':>11} "
        f"{'withheld':>9}",
    ]
    for run in runs:
        lines.append(
            f"{run.name:<26} {run.wall_s:>7.1f} {len(run.steps):>6} {run.groups:>7} "
            f"{run.median_step_s:>11.2f} {run.groups / run.wall_s:>9.2f} "
            f"{run.samples / run.wall_s:>10.2f} {100 * run.wait_share:>7.0f}% "
            f"{base.wall_s / run.wall_s:>7.2f}x "
            f"{base.median_step_s / run.median_step_s:>10.2f}x {run.withheld_groups:>9}"
        )
    lines += [
        "",
        "speedup = wall (a) / wall; step ratio = median step (a) / median step; waiting = share of"
        " wall time the trainer waited for data",
        "",
        "staleness of consumed groups (trainer version - oldest token version):",
    ]
    lines += [f"  {run.name:<26} {_histogram(run)}" for run in runs]
    lines += [
        "",
        "median per step (s): wait for data / train / weight update = set_policy(pause) "
        "(of which drain) + load + resume; LLM calls in flight at the pause",
    ]
    for run in runs:
        med = _medians(run)
        lines.append(
            f"  {run.name:<26} {med['wait_s']:.2f} / {med['train_s']:.2f} / "
            f"{med['update_s']:.2f} = {med['set_policy_s']:.2f} ({med['drained_s']:.2f}) + "
            f"{opts.load_s:.2f} + {med['resume_s']:.2f}; {med['drained_calls']:.0f} calls"
        )
    for run in runs:
        lines += [f"WARNING: {w}" for w in run.warnings]
        if run.usable != run.samples:
            lines.append(f"WARNING: {run.name}: {run.samples - run.usable} samples not usable")
        bound = run.max_staleness if run.max_staleness is not None else 0
        if any(s > bound for s in run.staleness):
            lines.append(f"WARNING: {run.name}: a consumed group is staler than {bound}")
    return "\n".join(lines)


def _medians(run: LoopRun) -> dict[str, float]:
    keys = (
        "wait_s", "train_s", "update_s", "drained_s", "set_policy_s", "resume_s", "drained_calls",
    )  # fmt: skip
    if not run.steps:
        return dict.fromkeys(keys, float("nan"))
    return {k: statistics.median(getattr(s, k) for s in run.steps) for k in keys}


def measure(opts: Options, api_url: str) -> list[LoopRun]:
    tasks = workload(opts)
    timeout = 120 + 10 * len(tasks) * (opts.call_ms / 1000 * max(TURNS) + opts.train_s)

    def client() -> Client:
        return Client(api_url, timeout=60)

    b = opts.batch_groups
    args = (opts.train_s, opts.load_s, timeout)
    print("warm-up (untimed: the workers boot) …", flush=True)
    run_sync(client, job_spec(opts, "warm-up"), tasks[:b], b, 0.0, 0.0, timeout)
    print(f"(a) synchronous, {opts.steps} steps …", flush=True)
    runs = [run_sync(client, job_spec(opts, "sync"), tasks, b, *args)]
    print(f"    {runs[-1].wall_s:.1f} s", flush=True)
    for label, s in zip("bcdefgh", opts.staleness, strict=False):
        print(f"({label}) asynchronous, max_staleness {s} …", flush=True)
        run = run_async(client, job_spec(opts, f"async-{s}"), tasks, b, s, *args)
        run.name = f"({label}) async, staleness {s}"
        runs.append(run)
        print(f"    {run.wall_s:.1f} s", flush=True)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tag = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-bench-async-{tag}-"))
    started_at = datetime.now(UTC)
    wall0 = time.monotonic()
    ok = False
    print(f"bench.async {tag}: logs in {tmp / 'logs'}", flush=True)
    ctx: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_before": os.getloadavg()}
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(lambda: cleanup_redis(opts.redis_url, tag))
            db_url, db_name = stack.enter_context(fresh_database(opts.pg_admin_url))
            upstream = free_port()
            settings = stack_settings(
                tag, db_url, opts.redis_url, tmp, upstream,
                proxy_admin_token=f"bench-admin-{uuid.uuid4().hex}",
            )  # fmt: skip
            local = stack.enter_context(LocalStack(settings, tmp / "logs"))
            local.fake_upstream(upstream, ttft_ms=opts.call_ms)
            local.proxy()
            local.workers(concurrency=_concurrency(opts.slots))
            local.sweeper()
            local.api()
            runs = measure(opts, f"http://{settings.api_host}:{settings.api_port}")
            ctx.update(
                tag=tag, database=db_name, load_after=os.getloadavg(),
                started_at=started_at.isoformat(), measure_wall_s=time.monotonic() - wall0,
            )  # fmt: skip
            print()
            print(render(opts, runs, ctx))
            opts.results_dir.mkdir(parents=True, exist_ok=True)
            path = opts.results_dir / f"async-{started_at:%Y%m%dT%H%M%S}.json"
            payload = {
                "options": vars(opts),
                "runs": [r.as_json() for r in runs],
                "context": ctx,
            }
            path.write_text(json.dumps(payload, indent=2, default=str))
            print(f"\nresults: {path}")
            ok = not any(r.warnings for r in runs)
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
    return 0 if ok else 1
