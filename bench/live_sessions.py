"""Live agent sessions on one node: what each costs while it sleeps (issue 37, item 4).

```bash
.venv/bin/python -m bench.live_sessions [--sizes 64,256,1024] [--sleep 60] [--keep-logs]
```

For each N: one `polar-mq worker` node (every stage; run-agent concurrency N), a fake vLLM-shaped
upstream behind the real proxy, and one job of N rollouts whose agent is a POSIX shell script
(`/bin/sh`, curl for its three chat calls: one at start, one after 2/3 of `--sleep`, one at the
end). Printed per N, and divided by N:

- memory (RSS and PSS) and threads of the node's own processes (every process under the node's
  supervisor but the agents), the increase over the same node idle before the job;
- memory of the agents (each script and its `sleep` child), apart;
- PostgreSQL connections (the node's own sockets to the server, and `pg_stat_activity` rows of
  the bench's database: node, proxy and the bench's poller), Redis connections of the node;
- idle CPU of the node and the proxy while every agent sleeps (a window in which no call was
  made), in cores;
- time from the submit until every agent made its first call, and until every rollout ended.

Every rollout must end `completed` with its 3 calls stored; a WARNING line says otherwise.
Figures go to `bench/results/live_sessions-<time>.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import Engine, func, select, text

from bench.live_probe import Probe, tree_cpu_s
from bench.pipeline.infra import cleanup_redis, fresh_database, stack_settings
from polar_mq.config import Settings
from polar_mq.dispatch.submit import enqueue_job
from polar_mq.infra.db import create_db_engine
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import LlmCall, Rollout, RolloutStatus
from polar_mq.runtimes import kill_group
from polar_mq.stack.devstack import LocalStack

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
AGENT_CALLS = 3
IDLE_WINDOW_S = 20.0
"""How long the node's and the proxy's CPU is taken once every session is live (longer than the
lease keeper's renewal period, `lease_s / 3`, so a renewal of every lease falls in it)."""
AGENT_SCRIPT = r"""# a live agent session: call, long sleep, call, sleep, call (sh and curl only)
call() {
  body='{"model":"'"$POLAR_MODEL"'","max_tokens":8,'
  body=$body'"messages":[{"role":"user","content":"turn '"$1"'"}]}'
  curl -sS -f --max-time 120 -o /dev/null -H "Authorization: Bearer $OPENAI_API_KEY" \
    -H 'Content-Type: application/json' -d "$body" "$OPENAI_BASE_URL/chat/completions" || exit 1
}
call 1
sleep "$1"
call 2
sleep "$2"
call 3
"""


@dataclass
class Options:
    sizes: list[int]
    sleep_s: float = 60.0
    redis_url: str = "redis://127.0.0.1:6379/6"
    pg_admin_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    keep_logs: bool = False
    min_free_gib: float = 6.0
    nofile: int | None = 1024
    prepare: int = 8
    """The node's prepare concurrency: how fast it starts sessions."""
    """The node's soft open-file limit at start (most systems' default), None: the bench's."""
    results_dir: Path | None = RESULTS_DIR


def agent_harness(script: Path, sleep_s: float) -> dict[str, Any]:
    first, second = round(sleep_s * 2 / 3, 3), round(sleep_s / 3, 3)
    # exec: the harness's `sh -c` becomes the script, one process fewer per session
    return {"type": "command", "command": f"exec /bin/sh {script} {first} {second}"}


def job_spec(n: int, harness: dict[str, Any], sleep_s: float) -> dict[str, Any]:
    return {
        "tasks": [{"instruction": f"live session {i}"} for i in range(n)],
        "samples_per_task": 1,
        "harness": harness,
        "evaluator": "completed",
        "builder": "per_call",
        "timeouts": {"agent_s": sleep_s * 2 + 300},
        "metadata": {"bench": "live_sessions", "n": n},
    }


# -- one size --------------------------------------------------------------------------------


@dataclass
class Counts:
    running: int = 0
    terminal: int = 0
    calls: int = 0
    pg_rows: int = 0


def _counts(engine: Engine, job_id: uuid.UUID, db_name: str) -> Counts:
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                select(Rollout.status, func.count())
                .where(Rollout.job_id == job_id)
                .group_by(Rollout.status)
            ).all()
        )
        calls = conn.execute(
            select(func.count())
            .select_from(LlmCall)
            .join(Rollout, Rollout.id == LlmCall.rollout_id)
            .where(Rollout.job_id == job_id)
        ).scalar_one()
        pg_rows = conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"), {"d": db_name}
        ).scalar_one()
    terminal = sum(int(v) for k, v in rows.items() if k in RolloutStatus.TERMINAL)
    return Counts(int(rows.get(RolloutStatus.RUNNING, 0)), terminal, int(calls), int(pg_rows))


@dataclass
class SizeRun:
    n: int
    figures: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def check_job(engine: Engine, job_id: uuid.UUID, n: int) -> list[str]:
    """Every rollout completed with its 3 calls stored; otherwise what was found."""
    with engine.connect() as conn:
        statuses = dict(
            conn.execute(
                select(Rollout.status, func.count())
                .where(Rollout.job_id == job_id)
                .group_by(Rollout.status)
            ).all()
        )
        per_rollout = conn.execute(
            select(Rollout.id, func.count(LlmCall.id))
            .outerjoin(LlmCall, LlmCall.rollout_id == Rollout.id)
            .where(Rollout.job_id == job_id)
            .group_by(Rollout.id)
        ).all()
        error = conn.execute(
            select(Rollout.error).where(Rollout.job_id == job_id, Rollout.error.is_not(None))
        ).first()
        restarted = conn.execute(
            select(func.count()).where(Rollout.job_id == job_id, Rollout.attempt > 1)
        ).scalar_one()
    warnings = []
    if restarted:
        warnings.append(f"{restarted} sessions were started over (a new attempt)")
    if statuses.get(RolloutStatus.COMPLETED, 0) != n:
        warnings.append(f"not every rollout completed: {statuses}")
        if error is not None:
            warnings.append(f"e.g. error: {str(error[0])[-300:]}")
    histogram: dict[int, int] = {}
    for _, count in per_rollout:
        histogram[int(count)] = histogram.get(int(count), 0) + 1
    if histogram != {AGENT_CALLS: n}:
        warnings.append(f"calls per rollout {{calls: rollouts}} = {histogram}")
    return warnings


def run_size(
    settings: Settings,
    engine: Engine,
    db_name: str,
    probe: Probe,
    proxy_pid: int,
    n: int,
    harness: dict[str, Any],
    sleep_s: float,
) -> SizeRun:
    """Submit `n` sessions to the (idle, warmed) node and follow them to the end."""
    run = SizeRun(n)
    idle = probe.snapshot()
    t0 = time.monotonic()
    job = enqueue_job(settings, job_spec(n, harness, sleep_s))
    peak_pg = peak_rows = 0
    started_s: float | None = None
    live: dict[str, Any] = {}
    cpu: dict[str, float] = {}
    deadline = t0 + 3 * sleep_s + 120 + n * 0.5
    while time.monotonic() < deadline:
        counts = _counts(engine, job.job_id, db_name)
        if "idle_s" in cpu or started_s is None:  # not in the idle-CPU window
            peak_pg = max(peak_pg, probe.pg_connections())
        peak_rows = max(peak_rows, counts.pg_rows)
        if started_s is None and counts.running + counts.terminal >= n and counts.calls >= n:
            started_s = time.monotonic() - t0
            live = probe.snapshot()
            cpu = {"calls": counts.calls, "node": probe.node_cpu_s(),
                   "proxy": tree_cpu_s(proxy_pid), "at": time.monotonic()}  # fmt: skip
        elif (started_s is not None and "idle_s" not in cpu) and (
            time.monotonic() - cpu["at"] >= IDLE_WINDOW_S or counts.terminal >= n
        ):
            window = time.monotonic() - cpu["at"]
            cpu["idle_s"] = window
            cpu["node_cores"] = (probe.node_cpu_s() - cpu["node"]) / window
            cpu["proxy_cores"] = (tree_cpu_s(proxy_pid) - cpu["proxy"]) / window
            cpu["calls_during"] = counts.calls - cpu["calls"]
        if counts.terminal >= n:
            break
        time.sleep(0.5)
    finished_s = time.monotonic() - t0
    run.warnings += check_job(engine, job.job_id, n)
    if started_s is None:
        run.warnings.append("not every session was live at once")
        return run
    run.figures = {
        "n": n,
        "idle_node": idle,
        "live": live,
        "peak_node_pg_connections": peak_pg,
        "peak_pg_stat_activity_rows": peak_rows,
        "idle_window_s": round(cpu.get("idle_s", 0.0), 2),
        "idle_window_calls": cpu.get("calls_during", 0),
        "idle_node_cores": round(cpu.get("node_cores", 0.0), 4),
        "idle_proxy_cores": round(cpu.get("proxy_cores", 0.0), 4),
        "all_live_s": round(started_s, 2),
        "all_done_s": round(finished_s, 2),
        "agent_sleep_s": sleep_s,
        "loadavg_1m_at_end": os.getloadavg()[0],  # other work on the machine slows the starts
    }
    return run


def per_session(f: dict[str, Any]) -> dict[str, float]:
    """The live figures over N: the node's increase over its idle self, the agents' whole."""
    n, live, idle = f["n"], f["live"], f["idle_node"]
    return {
        "node_rss_mib": (live["node_rss_mib"] - idle["node_rss_mib"]) / n,
        "node_pss_mib": (live["node_pss_mib"] - idle["node_pss_mib"]) / n,
        "node_threads": (live["node_threads"] - idle["node_threads"]) / n,
        "node_fds": (live["node_fds"] - idle["node_fds"]) / n,
        "agent_rss_mib": live["agent_rss_mib"] / n,
        "agent_pss_mib": live["agent_pss_mib"] / n,
        "agent_processes": live["agent_processes"] / n,
        "node_pg_connections": f["peak_node_pg_connections"] / n,
        "idle_node_cpu_ms_per_s": 1000 * f["idle_node_cores"] / n,
        "idle_proxy_cpu_ms_per_s": 1000 * f["idle_proxy_cores"] / n,
    }


def render(runs: list[SizeRun]) -> str:
    rows = [r for r in runs if r.figures]
    if not rows:
        return "no size ran to the end"
    head = f"{'':44}" + "".join(f"{'N=' + str(r.n):>12}" for r in rows)
    lines = [head]

    def line(label: str, values: list[str]) -> None:
        lines.append(f"{label:44}" + "".join(f"{v:>12}" for v in values))

    figs = [r.figures for r in rows]
    line("time until every agent made its 1st call s", [f"{f['all_live_s']:.1f}" for f in figs])
    line("time until every rollout ended s", [f"{f['all_done_s']:.1f}" for f in figs])
    line("  (agent's own run, s)", [f"{f['agent_sleep_s']:.0f}+3 calls" for f in figs])
    line("machine load average (1 min) at the end", [
        f"{f['loadavg_1m_at_end']:.1f}" for f in figs
    ])  # fmt: skip
    line("node processes", [str(f["live"]["node_processes"]) for f in figs])
    line("node RSS idle → live MiB", [
        f"{f['idle_node']['node_rss_mib']:.0f}→{f['live']['node_rss_mib']:.0f}" for f in figs
    ])  # fmt: skip
    line("node threads idle → live", [
        f"{f['idle_node']['node_threads']}→{f['live']['node_threads']}" for f in figs
    ])  # fmt: skip
    line("node PostgreSQL connections (peak)", [str(f["peak_node_pg_connections"]) for f in figs])
    line(
        "pg_stat_activity rows of the db (peak)",
        [str(f["peak_pg_stat_activity_rows"]) for f in figs],
    )
    line("node Redis connections (live)", [str(f["live"]["node_redis_connections"]) for f in figs])
    line("agent processes (live)", [str(f["live"]["agent_processes"]) for f in figs])
    line("calls in the CPU window (its length s)", [
        f"{f['idle_window_calls']} ({f['idle_window_s']:.0f})" for f in figs
    ])  # fmt: skip
    line("idle CPU node / proxy (cores)", [
        f"{f['idle_node_cores']:.3f}/{f['idle_proxy_cores']:.3f}" for f in figs
    ])  # fmt: skip
    lines.append("per live session:")
    per = [per_session(f) for f in figs]
    for key, fmt in (
        ("node_rss_mib", "{:.3f}"), ("node_pss_mib", "{:.3f}"), ("node_threads", "{:.2f}"),
        ("node_fds", "{:.2f}"), ("node_pg_connections", "{:.4f}"),
        ("agent_rss_mib", "{:.2f}"), ("agent_pss_mib", "{:.2f}"), ("agent_processes", "{:.2f}"),
        ("idle_node_cpu_ms_per_s", "{:.3f}"), ("idle_proxy_cpu_ms_per_s", "{:.3f}"),
    ):  # fmt: skip
        line(f"  {key}", [fmt.format(p[key]) for p in per])
    return "\n".join(lines)


# -- the stack -------------------------------------------------------------------------------


@contextlib.contextmanager
def node_of(
    local: LocalStack, n: int, nofile: int | None, prepare: int = 8
) -> Iterator[ManagedProcess]:
    """`polar-mq worker` for every stage, run-agent concurrency `n`, started with the soft
    open-file limit `nofile` (`prlimit`), as a service manager would start it."""
    name = local.settings.node_name
    counts = {Stage.PREPARE: prepare, Stage.RUN_AGENT: n, Stage.BUILD: 4, Stage.EVALUATE: 4}
    argv = [
        sys.executable, "-m", "polar_mq.cli", "worker", "--node", name, "--no-janitor",
        "--concurrency", ",".join(f"{s.value}={c}" for s, c in counts.items()),
    ]  # fmt: skip
    if nofile is not None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        argv = ["prlimit", f"--nofile={nofile}:{hard}", "--", *argv]
    env = {**local.env, "POLAR_MQ_NODE_NAME": name}
    node = ManagedProcess(f"node-{name}", argv, env, local.log_dir).start()
    try:
        yield node
    finally:
        node.stop()


def kill_leftover_agents(root: Path) -> int:
    """Kill the agents of runtimes under `root` still alive (an interrupted run stops the node
    under them) by their kill groups, and remove the groups; returns how many groups."""
    base = kill_group.base_dir()
    probe = kill_group.group_for("x", root)
    if base is None or probe is None:
        return 0
    suffix = probe.name.removeprefix("x")
    groups = [g for g in base.iterdir() if g.name.endswith(suffix)]
    for group in groups:
        kill_group.kill(group)
        kill_group.remove(group)
    return len(groups)


def run(opts: Options, tmp: Path) -> list[SizeRun]:
    tag = uuid.uuid4().hex[:8]
    script = tmp / "live_agent.sh"
    script.write_text(AGENT_SCRIPT)
    harness = agent_harness(script, opts.sleep_s)
    warm = agent_harness(script, 0)
    runs: list[SizeRun] = []
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: cleanup_redis(opts.redis_url, tag))
        stack.callback(kill_leftover_agents, tmp / "runtimes")
        db_url, db_name = stack.enter_context(fresh_database(opts.pg_admin_url))
        upstream = free_port()
        settings = stack_settings(tag, db_url, opts.redis_url, tmp, upstream)
        local = stack.enter_context(LocalStack(settings, tmp / "logs"))
        local.fake_upstream(upstream)
        proxy = local.proxy()
        engine = create_db_engine(db_url, pool_size=1, max_overflow=0)
        stack.callback(engine.dispose)
        for n in opts.sizes:
            free = psutil.virtual_memory().available / 2**30
            if free < opts.min_free_gib:
                print(f"N={n} skipped: {free:.1f} GiB available", flush=True)
                continue
            print(f"N={n}: starting the node …", flush=True)
            with node_of(local, n, opts.nofile, opts.prepare) as node:
                probe = Probe(node.pid, script)
                warmup = run_size(settings, engine, db_name, probe, proxy.pid, 4, warm, 0)
                if warmup.warnings:
                    raise RuntimeError(f"warm-up failed: {warmup.warnings}")
                time.sleep(2)
                result = run_size(
                    settings, engine, db_name, probe, proxy.pid, n, harness, opts.sleep_s
                )
            runs.append(result)
            print(f"N={n}: done in {result.figures.get('all_done_s', '?')} s", flush=True)
            for w in result.warnings:
                print(f"  WARNING N={n}: {w}", flush=True)
    return runs


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.live_sessions", description=__doc__)
    parser.add_argument("--sizes", default="64,256,1024", help="session counts, comma-separated")
    parser.add_argument("--sleep", type=float, default=60.0, help="each agent's sleep, s")
    parser.add_argument("--redis-url", default=Options.redis_url)
    parser.add_argument("--pg-admin-url", default=Options.pg_admin_url)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--prepare", type=int, default=8, help="the node's prepare threads")
    parser.add_argument(
        "--nofile", type=int, default=1024, help="the node's soft open-file limit at start (0: "
        "this process's)"
    )  # fmt: skip
    parser.add_argument(
        "--min-free-gib", type=float, default=6.0, help="skip a size with less memory available"
    )
    ns = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in ns.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes: integers, e.g. 64,256: {ns.sizes!r}")
    if not sizes or min(sizes) < 1 or ns.sleep < 0:
        parser.error("--sizes must be ≥ 1 and --sleep ≥ 0")
    return Options(sizes, ns.sleep, ns.redis_url, ns.pg_admin_url, ns.keep_logs, ns.min_free_gib)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-live-"))
    print(f"bench.live_sessions: logs in {tmp / 'logs'}", flush=True)
    ok = False
    try:
        runs = run(opts, tmp)
        print()
        print(render(runs))
        if opts.results_dir is not None:
            opts.results_dir.mkdir(parents=True, exist_ok=True)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            path = opts.results_dir / f"live_sessions-{stamp}.json"
            data = [{**r.figures, "per_session": per_session(r.figures) if r.figures else {},
                     "warnings": r.warnings} for r in runs]  # fmt: skip
            path.write_text(json.dumps(data, indent=2))
            print(f"\nresults: {path}")
        ok = not any(r.warnings for r in runs)
    finally:
        if ok and not opts.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"process logs kept in {tmp / 'logs'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
