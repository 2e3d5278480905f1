"""Time the dashboard's pages on a synthetic 1,000-rollout job, through a real API process.

    .venv/bin/python -m bench.ui [--rollouts 1000] [--samples 8] [--calls 3] [--repeats 20]

Creates a fresh PostgreSQL database (migrated, dropped afterwards), writes one finished job of
`--rollouts` rollouts (`bench/ui/synthetic.py`), starts `polar-mq api` on it with one API key,
signs in through the login form like a browser, then loads each page `--repeats` times after
one untimed warm-up and prints the median, p90 and max wall time per page (the whole HTTP
round trip: authentication, queries, rendering) and the API process's CPU per page (which, unlike
the wall time, does not depend on what else the machine runs; PostgreSQL's own time is not in
it). Target (issue 18): the job page under 1 s.
Figures also go to bench/results/ui.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.pipeline.infra import fresh_database
from bench.ui.synthetic import create_job
from polar_mq.config import Settings
from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.stack.devstack import LocalStack
from polar_mq.tenants.keys import create_api_key

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGET_S = 1.0


def _cpu_s(process: psutil.Process) -> float:
    """User + system CPU of the API process and its children (uvicorn may fork one)."""
    total = 0.0
    for proc in [process, *process.children(recursive=True)]:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


def _first_loads(client: httpx.Client, paths: list[str], api: psutil.Process) -> dict[str, Any]:
    """Each job page loaded once: nothing cached, every query and the whole render."""
    times, cpu = [], []
    for path in paths:
        cpu_before = _cpu_s(api)
        began = time.perf_counter()
        answer = client.get(path)
        times.append(time.perf_counter() - began)
        cpu.append(_cpu_s(api) - cpu_before)
        assert answer.status_code == 200, answer.status_code
    return {
        "n": len(paths),
        "median_s": statistics.median(times),
        "max_s": max(times),
        "api_cpu_s": statistics.median(cpu),
        "times_s": times,
    }


def _time_page(
    client: httpx.Client, path: str, repeats: int, api: psutil.Process
) -> dict[str, Any]:
    first = client.get(path)
    if first.status_code != 200:
        raise SystemExit(f"{path}: HTTP {first.status_code}: {first.text[:300]}")
    times = []
    cpu_before = _cpu_s(api)
    for _ in range(repeats):
        began = time.perf_counter()
        answer = client.get(path)
        times.append(time.perf_counter() - began)
        assert answer.status_code == 200, answer.status_code
    cpu_per_page = (_cpu_s(api) - cpu_before) / repeats
    times.sort()
    return {
        "api_cpu_s": cpu_per_page,
        "path": path,
        "bytes": len(first.content),
        "median_s": statistics.median(times),
        "p90_s": times[min(len(times) - 1, int(len(times) * 0.9))],
        "max_s": times[-1],
        "repeats": repeats,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with fresh_database(args.pg, "polar_mq_bench_ui") as (url, _name):
        engine = create_db_engine(url)
        factory = make_session_factory(engine)
        began = time.perf_counter()
        with unit_of_work(factory) as session:
            key = create_api_key(session, "bench", tenant="bench", scopes="jobs:read")
            small_job, _ = create_job(session, args.samples, args.samples, 1, "bench", 0)
            jobs = [
                create_job(session, args.rollouts, args.samples, args.calls, "bench", seed)
                for seed in range(args.seed, args.seed + args.jobs)
            ]
        job_id, rollout_id = jobs[0]
        setup_s = time.perf_counter() - began
        engine.dispose()
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(
                database_url=url,
                api_port=free_port(),
                proxy_port=free_port(),
                broker_url=args.redis_url,
                queue_prefix=f"benchui{uuid.uuid4().hex[:6]}",
            )
            with LocalStack(settings, Path(tmp)) as stack:
                api = psutil.Process(stack.api().pid)
                base = f"http://{settings.api_host}:{settings.api_port}"
                with httpx.Client(base_url=base, timeout=60) as client:
                    login = client.post("/ui/login", data={"api_key": key, "next": "/ui/"})
                    assert login.status_code == 303, login.text
                    # warm the process (imports, template compilation) on a small job
                    assert client.get(f"/ui/jobs/{small_job}").status_code == 200
                    first = _first_loads(client, [f"/ui/jobs/{j}" for j, _ in jobs], api)
                    pages = [
                        _time_page(client, f"/ui/jobs/{job_id}", args.repeats, api),
                        _time_page(client, "/ui/", args.repeats, api),
                        _time_page(client, f"/ui/rollouts/{rollout_id}", args.repeats, api),
                    ]
    return {
        "rollouts": args.rollouts,
        "samples_per_task": args.samples,
        "calls_per_rollout": args.calls,
        "synthetic_rows_s": setup_s,
        "first_loads": first,
        "pages": pages,
        "target_job_page_s": TARGET_S,
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"\nDashboard pages, synthetic job: {result['rollouts']} rollouts "
        f"({result['rollouts'] // result['samples_per_task']} groups of "
        f"{result['samples_per_task']}), {result['calls_per_rollout']} LLM calls each "
        f"(rows written in {result['synthetic_rows_s']:.1f} s)"
    )
    print(
        f"(load average {result['load_average_1m']:.1f} on {result['cpus']} CPUs: wall times "
        "grow with the load; the API's CPU per page does not)"
    )
    print(f"{'page':<58} {'KiB':>5} {'median':>8} {'p90':>8} {'max':>8} {'API CPU':>8}")
    for page in result["pages"]:
        print(
            f"{page['path']:<58} {page['bytes'] / 1024:>5.0f} {page['median_s'] * 1000:>6.0f}ms "
            f"{page['p90_s'] * 1000:>6.0f}ms {page['max_s'] * 1000:>6.0f}ms "
            f"{page['api_cpu_s'] * 1000:>6.0f}ms"
        )
    first = result["first_loads"]
    print(
        f"job page, first load of each of {first['n']} jobs (nothing cached): median "
        f"{first['median_s'] * 1000:.0f} ms, max {first['max_s'] * 1000:.0f} ms, API CPU "
        f"{first['api_cpu_s'] * 1000:.0f} ms; the repeated loads above reuse the render of the "
        "unchanged job (the render cache)"
    )
    for name, value in (
        ("first load", first["median_s"]),
        ("reload", result["pages"][0]["median_s"]),
    ):
        verdict = "meets" if value < result["target_job_page_s"] else "MISSES"
        print(
            f"job page {name} median {value * 1000:.0f} ms: {verdict} the target "
            f"< {result['target_job_page_s'] * 1000:.0f} ms"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ui", description=__doc__)
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=8, help="samples per task (group size)")
    parser.add_argument("--calls", type=int, default=3, help="LLM calls per rollout")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=5, help="jobs loaded once each, uncached")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pg", default=PG_ADMIN, help="admin URL of the PostgreSQL server")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/6")
    args = parser.parse_args(argv)
    if args.rollouts % args.samples:
        parser.error("--rollouts must be a multiple of --samples")
    result = run(args)
    report(result)
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "ui.json").write_text(json.dumps(result, indent=2))
    sys.stdout.flush()
