"""`python -m bench.proxy.workers [--clients 256] [--duration 8] [--repeats 3] [--stream]`:
calls/s and CPU per call of `polar-mq proxy --workers 2` against one worker, same run.

Each repeat starts the proxy afresh with 1, then 2 workers (interleaved, so drift hits both), in
front of the same fake engine (20 ms to first token, 32 tokens), logging every call to a fresh
PostgreSQL database, and loads it from `wrk` with `--clients` keep-alive connections. The
calls are one live rollout's (the proxy refuses calls of unknown rollouts). One worker numbers
calls itself; two share the per-rollout counter in Redis (`POLAR_MQ_PROXY_REDIS_URL`), as they
do in production. The engine called directly is measured in the same repeats: the ceiling.
Each run also splits the machine's busy time into the proxy, the engine, `wrk`, PostgreSQL and
Redis (`bench.proxy.machine`), and prints the calls/s at which one worker's run, at its CPU per
call of every process, would fill both cores: what a second worker could at most reach.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session

from bench.pipeline.infra import fresh_database
from bench.proxy import machine, targets
from bench.proxy.run import DEFAULT_PG, QUESTION
from bench.proxy.wrk import ERROR_KINDS, require_wrk, run_wrk
from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.infra.db import create_db_engine
from polar_mq.infra.ports import free_port
from polar_mq.models import Job, JobTask, Rollout, RolloutStatus
from polar_mq.stack.devstack import LocalStack

DEFAULT_REDIS = "redis://127.0.0.1:6379"


def live_rollout(database_url: str) -> uuid.UUID:
    engine = create_db_engine(database_url)
    try:
        with Session(engine) as session, session.begin():
            job = Job(samples_per_task=1, n_tasks=1, spec={})
            session.add(job)
            session.flush()
            task = JobTask(job_id=job.id, task_index=0, instance={})
            session.add(task)
            session.flush()
            rollout = Rollout(
                job_id=job.id,
                task_id=task.id,
                task_index=0,
                sample_index=0,
                status=RolloutStatus.RUNNING,
            )
            session.add(rollout)
            session.flush()
            return rollout.id
    finally:
        engine.dispose()


def wait_for_workers(base_url: str, workers: int, timeout_s: float = 60.0) -> None:
    """Until every worker has answered `/healthz` (the first one answers before the others)."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {workers} proxy workers answered")
        with contextlib.suppress(httpx.HTTPError):
            seen.add(httpx.get(f"{base_url}/healthz", timeout=5).json()["pid"])
        time.sleep(0.05)


def body(stream: bool, served: bool) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": "agent",
        "stream": stream,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    if served:  # what the proxy sends the engine
        data.update(model=targets.MODEL, return_token_ids=True, logprobs=True)
    return data


def measure(
    args: argparse.Namespace, tmp: Path, database_url: str, database: str
) -> dict[str, list[Any]]:
    secret = "bench-" + uuid.uuid4().hex
    rollout = live_rollout(database_url)
    auth = {"Authorization": f"Bearer {issue_rollout_token(secret, rollout, 7200)}"}
    upstream_port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    runs: dict[str, list[Any]] = {}
    base = targets.polar_settings(database_url, upstream, tmp / "spill", secret)
    with LocalStack(base, tmp / "logs") as engine_stack:
        engine = engine_stack.fake_upstream(upstream_port, ttft_ms=20.0, token_delay_ms=0.0)
        shared = {
            "engine": machine.tree(engine.pid),
            "postgres": machine.named("postgres", f" {database} "),
            "redis": machine.named("redis-server"),
        }
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats} ...", flush=True)
            with machine.MachineWindow(shared) as window:
                direct = run_wrk(
                    f"{upstream}/v1/chat/completions",
                    body(args.stream, True),
                    {},
                    args.clients,
                    args.duration,
                )
            runs.setdefault("direct", []).append(
                {**direct.as_json(), **_machine_json(window, direct.requests)}
            )
            for workers in (1, 2):
                settings = base.model_copy(
                    update={
                        "proxy_port": free_port(),
                        "proxy_workers": workers,
                        "proxy_redis_url": args.redis_url,
                        "proxy_spill_dir": tmp / f"spill-{workers}-{repeat}",
                    }
                )
                with LocalStack(settings, tmp / "logs") as stack:
                    proxy = stack.proxy()
                    wait_for_workers(settings.proxy_base_url, workers)
                    url = f"{settings.proxy_base_url}/v1/chat/completions"
                    run_wrk(url, body(args.stream, False), auth, args.clients, 2)  # warm-up
                    groups = {"proxy": machine.tree(proxy.pid), **shared}
                    with machine.MachineWindow(groups) as window:
                        result = run_wrk(
                            url, body(args.stream, False), auth, args.clients, args.duration
                        )
                    assert window.split is not None
                    cpu_s = window.split.cores["proxy"] * window.split.wall_s
                runs.setdefault(f"workers_{workers}", []).append(
                    {
                        **result.as_json(),
                        "cpu_ms_per_call": 1e3 * cpu_s / max(result.requests, 1),
                        **_machine_json(window, result.requests),
                    }
                )
    return runs


def _machine_json(window: machine.MachineWindow, calls: int) -> dict[str, Any]:
    split = window.split
    assert split is not None
    return {
        "busy_cores": split.busy,
        "cores": {**split.cores, "other": split.other},
        "ceiling_calls_per_s": split.ceiling(calls, os.cpu_count() or 1),
    }


def summary(runs: dict[str, list[Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, results in runs.items():
        out[key] = {
            field: statistics.median(r[field] for r in results)
            for field in (
                "rate", "p50_ms", "p99_ms", "errors", "cpu_ms_per_call", "busy_cores",
                "ceiling_calls_per_s",
            )
            if field in results[0]
        }  # fmt: skip
        out[key]["cores"] = {
            name: statistics.median(r["cores"][name] for r in results)
            for name in results[0]["cores"]
        }
        out[key]["error_kinds"] = {
            kind: statistics.median(r["error_kinds"][kind] for r in results) for kind in ERROR_KINDS
        }
    out["ratio_2_to_1"] = out["workers_2"]["rate"] / out["workers_1"]["rate"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy.workers", description=__doc__)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stream", action="store_true", help="32-chunk streams")
    parser.add_argument("--pg-admin-url", default=DEFAULT_PG)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    args = parser.parse_args(argv)
    require_wrk()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-workers-")))
        database_url, database = stack.enter_context(
            fresh_database(args.pg_admin_url, "polar_mq_bwork")
        )
        runs = measure(args, tmp, database_url, database)
    result = summary(runs)
    mode = "streamed" if args.stream else "non-streamed"
    print(f"\n{mode}, {args.clients} clients, medians of {args.repeats} repeats:")
    for key in ("direct", "workers_1", "workers_2"):
        row = result[key]
        cpu = f", {row['cpu_ms_per_call']:.2f} ms CPU/call" if "cpu_ms_per_call" in row else ""
        kinds = ", ".join(f"{k} {n:.0f}" for k, n in row["error_kinds"].items() if n)
        print(
            f"  {key:10} {row['rate']:8.0f} calls/s  p50 {row['p50_ms']:7.1f} ms  "
            f"errors {row['errors']:.0f}{f' ({kinds})' if kinds else ''}{cpu}"
        )
    print(f"  --workers 2 / 1: {result['ratio_2_to_1']:.2f}x")
    print(f"where the machine's time went (cores of {os.cpu_count() or 1}, medians):")
    for key in ("direct", "workers_1", "workers_2"):
        row = result[key]
        parts = ", ".join(f"{name} {value:.2f}" for name, value in row["cores"].items())
        print(f"  {key:10} busy {row['busy_cores']:.2f}: {parts}")
    one = result["workers_1"]
    print(
        f"  machine ceiling at workers_1's CPU per call (all processes): "
        f"{one['ceiling_calls_per_s']:.0f} calls/s = "
        f"{one['ceiling_calls_per_s'] / one['rate']:.2f}x one worker's rate"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
