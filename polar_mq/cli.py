"""The `polar-mq` command: every process of the system and the operator's everyday actions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from polar_mq.cli_keys import keys_app
from polar_mq.config import Settings, describe_config_error, get_settings
from polar_mq.harness_cli import harness_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(harness_app, name="harness")
console = Console()
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
DEFAULT_DRAIN_TIMEOUT_S = 600.0
"""How long `polar-mq worker` waits, on SIGTERM, for its rollouts (docker/compose.yaml gives
workers a longer stop grace period)."""


def _settings() -> Settings:
    """The process settings, or exit 2 with one line saying what to fix (never a traceback)."""
    try:
        return get_settings()
    except ValidationError as exc:
        _config_error(describe_config_error(exc))
        raise typer.Exit(2) from None
    except Exception as exc:  # e.g. a list setting that is not valid JSON
        _config_error(f"{type(exc).__name__}: {exc}")
        raise typer.Exit(2) from None


def _config_error(message: str) -> None:
    # Plain stderr, no markup or wrapping: the whole reason stays on one line for logs and tests.
    sys.stderr.write(f"configuration error: {' '.join(message.split())}\n")


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply the Alembic migrations to POLAR_MQ_DATABASE_URL."""
    from polar_mq.migrate import upgrade

    settings = _settings()
    upgrade(settings.database_url, revision)
    console.print(f"database at revision {revision}")


def _has_keys(settings: Settings) -> bool:
    from polar_mq.api.auth import has_active_keys
    from polar_mq.db import create_db_engine, make_session_factory

    engine = create_db_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            return has_active_keys(session)
    finally:
        engine.dispose()


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="port")] = None,
) -> None:
    """Serve the REST API."""
    import uvicorn

    from polar_mq.api.app import create_app

    settings = _settings()
    host = host or settings.api_host
    if host not in LOCAL_HOSTS and not _has_keys(settings):
        raise _fail(
            f"refusing to listen on {host} without API keys; create one with "
            "`polar-mq keys create NAME --tenant T --scopes S` or bind to 127.0.0.1"
        )
    uvicorn.run(
        create_app(settings), host=host, port=port or settings.api_port,
        access_log=False, log_level="warning",
    )  # fmt: skip


@app.command()
def proxy() -> None:
    """Serve the token-capturing LLM proxy in front of POLAR_MQ_UPSTREAM_URL."""
    from polar_mq.proxy.server import run_proxy

    run_proxy(_settings())


@app.command()
def worker(
    stages: Annotated[str, typer.Option(help="comma-separated stages")] = (
        "prepare,run_agent,build,evaluate"
    ),
    concurrency: Annotated[str | None, typer.Option(help="per stage, e.g. run_agent=8")] = None,
    pool: Annotated[str | None, typer.Option(help="worker pool (POLAR_MQ_POOL)")] = None,
    node: Annotated[str | None, typer.Option(help="node name (POLAR_MQ_NODE_NAME)")] = None,
    pool_impl: Annotated[str, typer.Option(help="Celery pool: threads | prefork")] = "threads",
    janitor: Annotated[
        bool, typer.Option(help="remove this node's orphan runtimes (one per node is enough)")
    ] = True,
    drain_timeout: Annotated[
        float,
        typer.Option(
            envvar="POLAR_MQ_DRAIN_TIMEOUT_S",
            help="on SIGTERM, seconds to finish this node's rollouts before stopping (0: no drain)",
        ),
    ] = DEFAULT_DRAIN_TIMEOUT_S,
    stop_grace: Annotated[
        float,
        typer.Option(help="after the drain timeout, seconds of warm shutdown before SIGKILL"),
    ] = 10.0,
    warm_pool: Annotated[
        bool, typer.Option(help="refill this node's warm pool (with the run_agent stage only)")
    ] = True,
) -> None:
    """Start one Celery worker process per stage on this node; restart any that dies.

    SIGTERM drains the node: no new rollouts are taken, the ones on this node finish, then the
    workers stop (at most --drain-timeout seconds). SIGINT stops at once.
    """
    from polar_mq.workers.drain import unfinished_on_node
    from polar_mq.workers.launcher import (
        DrainPolicy,
        parse_concurrency,
        parse_stages,
        plan_workers,
        supervise,
    )

    if pool:
        os.environ["POLAR_MQ_POOL"] = pool
    if node:
        os.environ["POLAR_MQ_NODE_NAME"] = node
    get_settings.cache_clear()
    settings = _settings()
    try:
        plan = plan_workers(
            settings, parse_stages(stages), parse_concurrency(concurrency), pool_impl
        )
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    for w in plan:
        console.print(f"{w.hostname}: queue {w.queue}, concurrency {w.concurrency}")
    if janitor:
        from polar_mq.workers.janitor import start_node_janitor

        start_node_janitor(settings)
    if drain_timeout < 0 or stop_grace < 0:
        raise _fail("--drain-timeout and --stop-grace must be ≥ 0", 2)
    drain = None
    if drain_timeout:
        drain = DrainPolicy(drain_timeout, unfinished_on_node(settings), kill_grace_s=stop_grace)
    agent_workers = [w for w in plan if w.stage.value == "run_agent"]
    refiller = None
    if warm_pool and agent_workers:
        from polar_mq.workers.warm_refiller import start_refiller

        refiller = start_refiller(settings, agent_workers[0].concurrency)
    code = supervise(plan, drain=drain)
    if refiller is not None:
        refiller.stop()  # empties the node's pool: a stopped node keeps no idle runtimes
    raise typer.Exit(code)


@app.command("warm-pool")
def warm_pool(
    agent_slots: Annotated[int, typer.Option(help="run_agent concurrency of this node")] = 8,
) -> None:
    """Keep this node's warm pool filled (`polar-mq worker` already runs one with run_agent).

    On SIGTERM it waits for the builds in flight and destroys the idle runtimes.
    """
    import signal
    import threading

    from polar_mq.workers.warm_refiller import start_refiller

    refiller = start_refiller(_settings(), agent_slots)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    while not stopping.wait(1.0):
        pass
    refiller.stop()


@app.command()
def janitor(
    interval: Annotated[float, typer.Option(help="seconds between sweeps")] = 5.0,
) -> None:
    """Remove this node's orphan runtimes (`polar-mq worker` already runs one)."""
    import signal

    from polar_mq.workers.janitor import start_node_janitor

    stop = start_node_janitor(_settings(), interval)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


@app.command()
def sweeper(
    interval: Annotated[float | None, typer.Option(help="seconds between sweeps")] = None,
    once: Annotated[bool, typer.Option("--once", help="sweep once, print, exit")] = False,
) -> None:
    """Restart rollouts whose worker died and re-send messages a broker lost (run one or more)."""
    import signal
    import threading

    from polar_mq.workers.sweeper import build_sweeper

    settings = _settings()
    if interval is not None:
        settings = settings.model_copy(update={"sweep_interval_s": interval})
    swept = build_sweeper(settings)
    if once:
        report = swept.sweep_once()
        console.print_json(data={k: v for k, v in vars(report).items() if k != "details"})
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    console.print(f"sweeper: every {settings.sweep_interval_s:g} s")
    swept.run_forever(stop)


@app.command()
def cancel(
    job_id: Annotated[str, typer.Argument(help="job id")],
    url: Annotated[str | None, typer.Option(help="API base URL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="POLAR_MQ_API_KEY")] = None,
) -> None:
    """Cancel every unfinished rollout of a job (running agents are killed)."""
    client = _client(url, api_key)
    result = client.cancel(job_id)
    console.print(
        f"cancelled {len(result['cancelled'])} rollouts "
        f"({result['already_terminal']} had already ended)"
    )


@app.command()
def flower(port: int = 5555, address: str = "127.0.0.1") -> None:
    """Start Flower, the Celery monitoring dashboard, on this broker."""
    env = dict(os.environ)
    if address in LOCAL_HOSTS:
        env.setdefault("FLOWER_UNAUTHENTICATED_API", "true")
    argv = [
        sys.executable, "-m", "celery", "-A", "polar_mq.workers.entry", "flower",
        f"--port={port}", f"--address={address}",
    ]  # fmt: skip
    os.execvpe(argv[0], argv, env)


def _load_job_file(path: Path) -> dict[str, Any]:
    """The job spec a file holds (see `polar_mq.jobs.tasks_file` for the formats)."""
    from polar_mq.jobs.tasks_file import TasksFileError, load_job_file

    try:
        return load_job_file(path).spec()
    except TasksFileError as exc:
        raise _fail(str(exc), 2) from exc


def _json_option(value: str, name: str) -> Any:
    """A CLI value that is either a bare name or a JSON object (`--evaluator '{"name": ...}'`)."""
    if not value.lstrip().startswith("{"):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise _fail(f"--{name} is not valid JSON: {exc}", 2) from exc


def _client(url: str | None, api_key: str | None) -> Any:
    from polar_mq.client import Client

    settings = _settings()
    return Client(url or f"http://{settings.api_host}:{settings.api_port}", api_key)


DEFAULT_SAMPLES = 4


@app.command()
def submit(
    file: Annotated[
        Path,
        typer.Argument(help="job .json, tasks .jsonl / .yaml / .json, or a Harbor tasks folder"),
    ],
    samples: Annotated[
        int | None, typer.Option(help=f"samples per task (file, else {DEFAULT_SAMPLES})")
    ] = None,
    harness: Annotated[
        str | None, typer.Option(help="reference | command, or a JSON harness object")
    ] = None,
    command: Annotated[
        str | None, typer.Option(help="shell command of the command harness ({instruction}…)")
    ] = None,
    evaluator: Annotated[
        str | None,
        typer.Option(
            help="name or JSON; default: exact_match if every task has an answer, "
            "tests if every task has hidden tests"
        ),
    ] = None,
    builder: Annotated[str | None, typer.Option(help="per_call | prefix_merge")] = None,
    model: Annotated[str | None, typer.Option(help="model name the agent is told")] = None,
    temperature: Annotated[float | None, typer.Option(help="sampling temperature")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="max tokens per LLM call")] = None,
    agent_timeout: Annotated[float | None, typer.Option(help="agent wall clock, s")] = None,
    pool: Annotated[str | None, typer.Option(help="worker pool")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait and print results")] = False,
    url: Annotated[str | None, typer.Option(help="API base URL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="POLAR_MQ_API_KEY")] = None,
) -> None:
    """Submit a job file, or a tasks file plus options for the rest of the job.

    Options override the file; fields neither sets get the API's defaults, except samples per
    task (4: a GRPO group) and the evaluator (exact_match when every task has an answer, tests
    when every task has hidden tests, e.g. a Harbor tasks folder).
    """
    from polar_mq.client import PolarMQError

    spec = _load_job_file(file)
    if command is not None:
        spec["harness"] = {"type": "command", "command": command}
    elif harness is not None:
        chosen = _json_option(harness, "harness")
        spec["harness"] = chosen if isinstance(chosen, dict) else {"type": chosen}
    if evaluator is not None:
        spec["evaluator"] = _json_option(evaluator, "evaluator")
    elif "evaluator" not in spec and all("answer" in t for t in spec["tasks"]):
        spec["evaluator"] = "exact_match"
    elif "evaluator" not in spec and all("tests" in t for t in spec["tasks"]):
        spec["evaluator"] = "tests"
    sampling = dict(spec.get("sampling") or {})
    if temperature is not None:
        sampling["temperature"] = temperature
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    if sampling:
        spec["sampling"] = sampling
    if agent_timeout is not None:
        spec["timeouts"] = {**(spec.get("timeouts") or {}), "agent_s": agent_timeout}
    options = {"samples_per_task": samples, "builder": builder, "model": model, "pool": pool}
    spec.update({key: value for key, value in options.items() if value is not None})
    spec.setdefault("samples_per_task", DEFAULT_SAMPLES)
    client = _client(url, api_key)
    try:
        submitted = client.submit_spec(spec)
        console.print(f"job {submitted.job_id}: {len(submitted.rollout_ids)} rollouts")
        if wait:
            status = client.wait(str(submitted.job_id), progress=True)
            console.print_json(data=status)
    except PolarMQError as exc:
        raise _fail(str(exc)) from exc


@app.command()
def export(
    job_id: Annotated[str, typer.Argument(help="a job id")],
    format: Annotated[
        str | None, typer.Option("--format", help="jsonl | parquet (default: by --out suffix)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="output file (default JOB.FORMAT)")] = None,
    complete_only: Annotated[
        bool, typer.Option("--complete-only/--all-groups", help="only complete groups")
    ] = True,
    advantages: Annotated[
        str | None, typer.Option(help="grpo: add group-relative advantages")
    ] = None,
    artifacts: Annotated[
        Path | None,
        typer.Option(help="also save each rollout's artifacts under DIR/<rollout id>/"),
    ] = None,
    url: Annotated[str | None, typer.Option(help="API base URL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="POLAR_MQ_API_KEY")] = None,
) -> None:
    """Write a job's training samples (one row each) as JSONL or Parquet."""
    from polar_mq.client import PolarMQError
    from polar_mq.export import resolve_format

    try:
        chosen = resolve_format(out or Path(f"{job_id}.jsonl"), format)
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    path = out or Path(f"{job_id}.{chosen.value}")
    if advantages is not None and advantages != "grpo":
        raise _fail(f"unknown --advantages {advantages!r}; known: grpo", 2)
    client = _client(url, api_key)
    try:
        summary = client.export(
            job_id, path, chosen.value, complete_only, advantages, artifacts_dir=artifacts
        )
    except PolarMQError as exc:
        raise _fail(str(exc)) from exc
    except OSError as exc:
        raise _fail(f"cannot write {path}: {exc}") from exc
    console.print(f"{summary.rows} samples of {summary.groups} groups → {summary.path}")
    if artifacts is not None:
        console.print(f"{summary.artifacts} artifact files → {artifacts}")
    if not summary.job_finished:
        console.print("[yellow]the job is still running: later groups are not in this file[/]")


@app.command()
def status(
    job_id: Annotated[str | None, typer.Argument(help="a job id; all jobs when omitted")] = None,
    url: Annotated[str | None, typer.Option(help="API base URL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="POLAR_MQ_API_KEY")] = None,
) -> None:
    """Print a job's status, or the list of jobs."""
    from polar_mq.client import PolarMQError

    client = _client(url, api_key)
    try:
        console.print_json(data=client.status(job_id) if job_id else client.jobs())
    except PolarMQError as exc:
        raise _fail(str(exc)) from exc


@app.command()
def groups(
    job_id: Annotated[str, typer.Argument(help="a job id")],
    consumer: Annotated[
        str | None, typer.Option(help="consumer name holding the leases (default: unique)")
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="groups leased per call")] = 16,
    lease_s: Annotated[float, typer.Option(help="unacked groups come back after this")] = 60.0,
    ack: Annotated[
        bool, typer.Option("--ack/--no-ack", help="acknowledge each batch once printed")
    ] = True,
    trajectories: Annotated[bool, typer.Option(help="include token arrays")] = False,
    url: Annotated[str | None, typer.Option(help="API base URL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="POLAR_MQ_API_KEY")] = None,
) -> None:
    """Print a job's complete groups as they finish (one JSON line each), leasing them.

    With --ack (the default) the groups are consumed: a trainer leasing the same job will not
    see them again. --no-ack only peeks: it stops when the printed groups come back after their
    leases ran out, and they are handed out again to the next consumer.
    """
    from polar_mq.client import PolarMQError

    client = _client(url, api_key)
    stream = client.stream_groups(
        job_id, batch_size=batch_size, consumer=consumer, lease_s=lease_s,
        ack="auto" if ack else "manual", include_trajectories=trajectories,
    )  # fmt: skip
    printed: set[int] = set()
    try:
        for batch in stream:
            fresh = [g for g in batch if g["task_index"] not in printed]
            for group in fresh:
                sys.stdout.write(json.dumps(group, default=str) + "\n")
            sys.stdout.flush()
            printed.update(g["task_index"] for g in fresh)
            if not ack and not fresh:
                return  # peeking: the leases ran out and the printed groups came back
    except PolarMQError as exc:
        raise _fail(str(exc)) from exc


@app.command()
def demo(
    fake: Annotated[bool, typer.Option(help="use the built-in fake upstream, not vLLM")] = False,
    tasks: Annotated[int, typer.Option(help="number of arithmetic tasks")] = 8,
    samples: Annotated[int, typer.Option(help="samples per task")] = 4,
) -> None:
    """Run everything locally (SQLite, embedded broker, real CPU vLLM) and print the results."""
    from polar_mq.demo import run_demo

    raise typer.Exit(run_demo(use_fake=fake, n_tasks=tasks, samples=samples))


@app.command()
def policy(
    version: Annotated[
        int | None, typer.Argument(help="set this policy version (omit to show the current one)")
    ] = None,
    pause: Annotated[
        bool, typer.Option(help="hold new LLM calls and drain the ones in flight first")
    ] = False,
    resume: Annotated[bool, typer.Option(help="let held LLM calls go (weights loaded)")] = False,
    drain_timeout: Annotated[float, typer.Option(help="seconds to wait for the drain")] = 30.0,
    url: Annotated[str | None, typer.Option(help="API base URL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="POLAR_MQ_API_KEY")] = None,
) -> None:
    """Show or set the trainer's policy version (weight updates; see docs/async_rl.md)."""
    from polar_mq.client import PolarMQError

    if resume and (version is not None or pause):
        raise _fail("--resume takes no version and no --pause")
    client = _client(url, api_key)
    try:
        if resume:
            answer = client.resume_policy()
        elif version is not None:
            answer = client.set_policy(version, pause=pause, drain_timeout_s=drain_timeout)
        else:
            answer = client.policy()
    except PolarMQError as exc:
        raise _fail(str(exc)) from exc
    sys.stdout.write(json.dumps(answer, default=str) + "\n")


def main() -> None:
    try:
        app()
    except subprocess.CalledProcessError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
