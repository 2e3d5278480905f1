"""`--profile DIR`: py-spy on every polar_mq process during one extra, untimed run of (2) and (3).

The timed runs are never profiled (py-spy pauses the processes it samples). Raw collapsed stacks
are written to DIR/<kind>-<process>.txt (feed them to any flamegraph tool), and a summary names,
per process, the share of its busy samples spent under a few known cost centres.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

RATE_HZ = 250

# (label, substring of a frame "function (file)"); a sample counts under every label it matches.
COST_CENTRES: tuple[tuple[str, str], ...] = (
    ("Celery consumer loop (receive, ack, task events)", "asynloop (celery/worker/loops.py"),
    ("Celery task execution (trace + task body)", "trace_task (celery/app/trace.py"),
    ("polar_mq run_stage (claim, stage, finish)", "run_stage (polar_mq/workers/runner.py"),
    ("claim (transitions.claim)", "claim (polar_mq/lifecycle/transitions.py"),
    ("finish (transitions.finish + commit)", "finish (polar_mq/lifecycle/transitions.py"),
    ("publish next stage (after commit)", "publish_messages (polar_mq/dispatch/celery_app.py"),
    ("SQL execute (all statements)", "do_execute (sqlalchemy/engine/default.py"),
    ("connection checkout (+ pre-ping)", "_checkout (sqlalchemy/pool/base.py"),
    ("pre-ping SELECT 1", "do_ping (sqlalchemy/engine/default.py"),
    ("commit", "commit (sqlalchemy/orm/session.py"),
    ("ORM flush", "flush (sqlalchemy/orm/session.py"),
    ("runtime start (mkdir + files)", "start (polar_mq/runtimes/local.py"),
    ("runtime stop (kill scan + rmtree)", "stop (polar_mq/runtimes/local.py"),
    ("/proc environ scan (tagged processes)", "tagged_processes (polar_mq/runtimes/process_kit.py"),
    ("agent exec (spawn + supervise)", "exec (polar_mq/runtimes/base.py"),
    ("process spawn (fork/exec)", "_execute_child (subprocess.py"),
    ("proxy log flush HTTP call", "flush_proxy (polar_mq/workers/stages/common.py"),
    ("rollout token signing", "issue_rollout_token (polar_mq/capability/tokens.py"),
    ("evaluator", "evaluate (polar_mq/evaluators"),
    ("trajectory builder", "build (polar_mq/trajectories"),
    ("Celery task events", "send_event (celery/"),
    ("kombu publish", "publish (kombu/messaging.py"),
    ("proxy: log writer (DB insert)", "polar_mq/proxy/store/writer.py"),
    ("proxy: call record building", "polar_mq/proxy/store/record.py"),
    ("proxy: upstream HTTP (httpx)", "httpx/_client.py"),
    ("proxy: token check", "polar_mq/proxy/server/auth.py"),
)


def py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def recording(out_dir: Path, kind: str, pids: Mapping[str, int]) -> Iterator[dict[str, Path]]:
    exe = py_spy()
    if exe is None:
        raise RuntimeError("--profile needs py-spy (e.g. .venv/bin/pip install py-spy)")
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = {name: out_dir / f"{kind}-{name}.txt" for name in pids}
    stack = contextlib.ExitStack()
    procs = [
        subprocess.Popen(
            [
                exe,
                "record",
                "-p",
                str(pid),
                "-r",
                str(RATE_HZ),
                "-f",
                "raw",
                "--nolineno",
                "--gil",
                "--subprocesses",  # `polar-mq worker` supervises the Celery worker it starts
                "-o",
                str(outputs[name]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=stack.enter_context(outputs[name].with_suffix(".log").open("wb")),
        )
        for name, pid in pids.items()
    ]
    try:
        time.sleep(1.5)  # attach
        yield outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stack.close()


@dataclass
class ProfileSummary:
    process: str
    samples: int
    shares: list[tuple[str, float]]
    top_self: list[tuple[str, float]]


def summarise(name: str, path: Path, top: int = 6) -> ProfileSummary:
    """Share of busy samples under each cost centre, and the hottest leaf functions."""
    total = 0
    hits: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ProfileSummary(name, 0, [], [])
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        for label, needle in COST_CENTRES:
            if needle in stack:
                hits[label] += count
        leaves[stack.rsplit(";", 1)[-1]] += count
    if not total:
        return ProfileSummary(name, 0, [], [])
    shares = [(label, 100.0 * c / total) for label, c in hits.most_common() if c / total >= 0.02]
    top_self = [(leaf, 100.0 * c / total) for leaf, c in leaves.most_common(top)]
    return ProfileSummary(name, total, shares, top_self)


def render(
    kind: str, n: int, summaries: list[ProfileSummary], timed_ms: Mapping[str, float]
) -> list[str]:
    """Shares of samples, turned into ms per item with each process's CPU from the timed runs
    (py-spy's own pauses inflate the profiled run, so its sample counts are not used as times)."""
    lines = [
        f"py-spy (GIL-holding samples), untimed extra run of {kind} ({n} items): share of each "
        "process's samples x its CPU per item in the timed runs (median)"
    ]
    for s in summaries:
        timed = timed_ms.get(s.process, float("nan"))
        lines.append(f"  {s.process}: {timed:.2f} ms/item in the timed runs; {s.samples} samples")
        for label, pct in s.shares:
            lines.append(f"    {pct:5.1f}%  ≈{pct * timed / 100:5.2f} ms  {label}")
        hottest = ", ".join(f"{leaf} {pct:.0f}%" for leaf, pct in s.top_self[:3])
        lines.append(f"    hottest leaves: {hottest}")
    return lines
