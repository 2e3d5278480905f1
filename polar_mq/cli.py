"""The `polar-mq` command: every process of the system and the operator's everyday actions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from polar_mq.config import Settings, get_settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
keys_app = typer.Typer(no_args_is_help=True, help="REST API keys.")
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
console = Console()
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def _settings() -> Settings:
    try:
        return get_settings()
    except Exception as exc:  # pydantic ValidationError: show it as a CLI message, not a traceback
        console.print(f"[red]configuration error:[/red] {exc}")
        raise typer.Exit(2) from exc


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


@keys_app.command("create")
def keys_create(name: str) -> None:
    """Create an API key; it is printed once and only its hash is stored."""
    from polar_mq.api.auth import create_api_key
    from polar_mq.db import create_db_engine, make_session_factory, unit_of_work

    engine = create_db_engine(_settings().database_url)
    with unit_of_work(make_session_factory(engine)) as session:
        key = create_api_key(session, name)
    print(key)


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
            "`polar-mq keys create NAME` or bind to 127.0.0.1"
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
) -> None:
    """Start one Celery worker process per stage on this node and supervise them."""
    from polar_mq.workers.launcher import (
        parse_concurrency,
        parse_stages,
        plan_workers,
        spawn,
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
    raise typer.Exit(supervise(spawn(plan)))


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
    """A job is a JSON object (the POST /v1/jobs body), or JSONL: one task per line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc}", 2) from exc
    try:
        if path.suffix == ".jsonl":
            return {"tasks": [json.loads(line) for line in text.splitlines() if line.strip()]}
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"{path} is not valid JSON: {exc}", 2) from exc
    if isinstance(data, list):
        return {"tasks": data}
    if not isinstance(data, dict):
        raise _fail(f"{path} must hold a job object or a list of tasks", 2)
    return data


def _client(url: str | None, api_key: str | None) -> Any:
    from polar_mq.client import Client

    settings = _settings()
    return Client(url or f"http://{settings.api_host}:{settings.api_port}", api_key)


@app.command()
def submit(
    file: Path,
    samples: Annotated[int | None, typer.Option(help="samples per task")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait and print results")] = False,
    url: Annotated[str | None, typer.Option(help="API base URL")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="POLAR_MQ_API_KEY")] = None,
) -> None:
    """Submit a job file (JSON job object, JSON list of tasks, or JSONL of tasks)."""
    from polar_mq.client import PolarMQError

    spec = _load_job_file(file)
    if samples is not None:
        spec["samples_per_task"] = samples
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
def demo(
    fake: Annotated[bool, typer.Option(help="use the built-in fake upstream, not vLLM")] = False,
    tasks: Annotated[int, typer.Option(help="number of arithmetic tasks")] = 8,
    samples: Annotated[int, typer.Option(help="samples per task")] = 4,
) -> None:
    """Run everything locally (SQLite, embedded broker, real CPU vLLM) and print the results."""
    from polar_mq.demo import run_demo

    raise typer.Exit(run_demo(use_fake=fake, n_tasks=tasks, samples=samples))


def main() -> None:
    try:
        app()
    except subprocess.CalledProcessError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
