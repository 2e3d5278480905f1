"""The long-running processes of the system: `polar-mq api | proxy | worker | warm-pool |
janitor | sweeper | flower`, and `demo`, which starts all of them locally."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from polar_mq.cli.common import LOCAL_HOSTS, console, fail, load_settings
from polar_mq.config import Settings, get_settings

DEFAULT_DRAIN_TIMEOUT_S = 600.0
"""How long `polar-mq worker` waits, on SIGTERM, for its rollouts (docker/compose.yaml gives
workers a longer stop grace period)."""


def _has_keys(settings: Settings) -> bool:
    from polar_mq.api.auth import has_active_keys
    from polar_mq.infra.db import create_db_engine, make_session_factory

    engine = create_db_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            return has_active_keys(session)
    finally:
        engine.dispose()


def api(
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="port")] = None,
) -> None:
    """Serve the REST API."""
    import uvicorn

    from polar_mq.infra.header_timeout import header_timeout_protocol
    from polar_mq.observability.logs import configure_from_settings
    from polar_mq.ui.app import create_app

    settings = load_settings()
    configure_from_settings("api", settings)
    host = host or settings.api_host
    if host not in LOCAL_HOSTS and not _has_keys(settings):
        raise fail(
            f"refusing to listen on {host} without API keys; create one with "
            "`polar-mq keys create NAME --tenant T --scopes S` or bind to 127.0.0.1"
        )
    uvicorn.run(
        create_app(settings), host=host, port=port or settings.api_port,
        access_log=False, log_level="warning", log_config=None,
        http=header_timeout_protocol(settings.header_read_timeout_s),  # half-sent heads: closed
    )  # fmt: skip


def proxy(
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="processes serving the port (POLAR_MQ_PROXY_WORKERS)"),
    ] = None,
) -> None:
    """Serve the token-capturing LLM proxy in front of POLAR_MQ_UPSTREAM_URL."""
    from polar_mq.proxy.server.run import run_proxy

    if workers is not None:  # validated with the rest (it needs a shared call counter)
        os.environ["POLAR_MQ_PROXY_WORKERS"] = str(workers)
    run_proxy(load_settings())


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
    start: Annotated[
        str,
        typer.Option(
            help="forkserver: fork the stage workers from one pre-imported process (less "
            "start-up CPU); exec: start each as a fresh `celery worker` process"
        ),
    ] = "forkserver",
) -> None:
    """Start one Celery worker process per stage on this node; restart any that dies.

    SIGTERM drains the node: no new rollouts are taken, the ones on this node finish, then the
    workers stop (at most --drain-timeout seconds). SIGINT stops at once.
    """
    from polar_mq.workers.drain import unfinished_on_node
    from polar_mq.workers.launcher import (
        DrainPolicy,
        check_start_method,
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
    settings = load_settings()
    from polar_mq.observability.logs import configure_from_settings

    configure_from_settings("node", settings)
    from polar_mq.runtimes.private_view import report_node

    report_node(settings)  # what `local` agents will not see here, or that they see everything
    try:
        plan = plan_workers(
            settings, parse_stages(stages), parse_concurrency(concurrency), pool_impl
        )
        check_start_method(start)
        from polar_mq.workers.open_files import ensure

        ensure(w.concurrency for w in plan)  # before the workers start: they inherit it
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    for w in plan:
        console.print(f"{w.hostname}: queue {w.queue}, concurrency {w.concurrency}")
    if janitor:
        from polar_mq.workers.janitor import start_node_janitor

        start_node_janitor(settings)
    if drain_timeout < 0 or stop_grace < 0:
        raise fail("--drain-timeout and --stop-grace must be ≥ 0", 2)
    from polar_mq.workers.node_metrics import serve_node_metrics

    try:
        metrics = serve_node_metrics(settings, [w.queue for w in plan])
    except OSError as exc:  # the port is taken
        port = settings.worker_metrics_port
        raise fail(f"cannot serve node metrics on port {port}: {exc}", 2) from None
    drain = None
    if drain_timeout:
        drain = DrainPolicy(drain_timeout, unfinished_on_node(settings), kill_grace_s=stop_grace)
    agent_workers = [w for w in plan if w.stage.value == "run_agent"]
    refiller = None
    if warm_pool and agent_workers:
        from polar_mq.workers.warm_refiller import start_refiller

        refiller = start_refiller(settings, agent_workers[0].concurrency)
    code = supervise(plan, env=metrics.env if metrics else None, drain=drain, start=start)
    if metrics is not None:
        metrics.stop()
    if refiller is not None:
        refiller.stop()  # empties the node's pool: a stopped node keeps no idle runtimes
    raise typer.Exit(code)


def warm_pool(
    agent_slots: Annotated[int, typer.Option(help="run_agent concurrency of this node")] = 8,
) -> None:
    """Keep this node's warm pool filled (`polar-mq worker` already runs one with run_agent).

    On SIGTERM it waits for the builds in flight and destroys the idle runtimes.
    """
    import signal
    import threading

    from polar_mq.observability.logs import configure_from_settings
    from polar_mq.workers.warm_refiller import start_refiller

    settings = load_settings()
    configure_from_settings("warm-pool", settings)
    refiller = start_refiller(settings, agent_slots)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    while not stopping.wait(1.0):
        pass
    refiller.stop()


def janitor(
    interval: Annotated[float, typer.Option(help="seconds between sweeps")] = 5.0,
) -> None:
    """Remove this node's orphan runtimes (`polar-mq worker` already runs one)."""
    import signal

    from polar_mq.observability.logs import configure_from_settings
    from polar_mq.workers.janitor import start_node_janitor

    settings = load_settings()
    configure_from_settings("janitor", settings)
    stop = start_node_janitor(settings, interval)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def sweeper(
    interval: Annotated[float | None, typer.Option(help="seconds between sweeps")] = None,
    once: Annotated[bool, typer.Option("--once", help="sweep once, print, exit")] = False,
) -> None:
    """Restart rollouts whose worker died and re-send messages a broker lost (run one or more)."""
    import signal
    import threading

    from polar_mq.workers.sweeper import build_sweeper

    settings = load_settings()
    if interval is not None:
        settings = settings.model_copy(update={"sweep_interval_s": interval})
    from polar_mq.observability.logs import configure_from_settings
    from polar_mq.observability.sweeper_metrics import serve_sweeper_metrics

    configure_from_settings("sweeper", settings)
    try:
        serve_sweeper_metrics(settings)
    except OSError as exc:
        port = settings.sweeper_metrics_port
        raise fail(f"cannot serve sweeper metrics on port {port}: {exc}", 2) from None
    swept = build_sweeper(settings)
    if once:
        report = swept.sweep_once()
        console.print_json(data={k: v for k, v in vars(report).items() if k != "details"})
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    console.print(f"sweeper: every {settings.sweep_interval_s:g} s")
    from polar_mq.retention.maintenance import start_call_maintenance

    start_call_maintenance(settings, stop)  # call partitions ahead + automatic prune
    swept.run_forever(stop)


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


def demo(
    fake: Annotated[bool, typer.Option(help="use the built-in fake upstream, not vLLM")] = False,
    tasks: Annotated[int, typer.Option(help="number of arithmetic tasks")] = 8,
    samples: Annotated[int, typer.Option(help="samples per task")] = 4,
) -> None:
    """Run everything locally (SQLite, embedded broker, real CPU vLLM) and print the results."""
    from polar_mq.stack.demo import run_demo

    raise typer.Exit(run_demo(use_fake=fake, n_tasks=tasks, samples=samples))
