"""`network: proxy_only` for the `docker` runtime: the container's side of the proxy relay.

The container runs on network `none` (its own loopback, nothing else). One node directory per
runtime, `<runtime>/relay` (the worker's, mode 0711), is bind mounted read-only at `RELAY_INSIDE`
for the container's lifetime: it holds a copy of `forwarder.py` and, while a command runs, that
command's Unix socket, served on the node by `ProxyRelay` (a name of its own per command). Each
command is wrapped as `python -I -S /run/polar-mq/forwarder.py 8010 <socket> COMMAND...`, run as
the agent user like every exec, so the agent finds the proxy on the container's 127.0.0.1:8010
and nothing else. The forwarder runs with the image's interpreter (`DockerRuntime.python`): every
image the scripts build has Python 3; an image without one fails at `start()` with the reason,
before any agent runs, rather than as an agent error.
"""

from __future__ import annotations

from pathlib import Path

from polar_mq.runtimes import forwarder
from polar_mq.runtimes.process_kit import atomic_write
from polar_mq.runtimes.proxy_relay import PROXY_PORT_INSIDE

RELAY_INSIDE = "/run/polar-mq"
_FORWARDER = "forwarder.py"


def relay_dir(runtime_path: Path) -> Path:
    """Where the node serves a runtime's relay sockets (removed with the runtime's directory)."""
    return runtime_path / "relay"


def prepare(runtime_path: Path) -> Path:
    """Create the relay directory with the forwarder in it (idempotent); return the directory.

    The agent may traverse it and connect to its own socket, not list it or write into it."""
    directory = relay_dir(runtime_path)
    directory.mkdir(mode=0o711, exist_ok=True)
    directory.chmod(0o711)
    atomic_write(directory / _FORWARDER, Path(forwarder.__file__).read_bytes())
    (directory / _FORWARDER).chmod(0o644)
    return directory


def mount(runtime_path: Path) -> dict[str, dict[str, str]]:
    """The container's volume entry for the relay directory."""
    return {str(relay_dir(runtime_path)): {"bind": RELAY_INSIDE, "mode": "ro"}}


def check_argv(python: str) -> list[str]:
    """A command that succeeds when the image's interpreter can run the forwarder."""
    return [python, "-I", "-S", f"{RELAY_INSIDE}/{_FORWARDER}", "--check"]


def wrap(python: str, socket_name: str, argv: list[str]) -> list[str]:
    """`argv` behind the forwarder that relays 127.0.0.1:8010 to the command's socket."""
    inner = [
        f"{RELAY_INSIDE}/{_FORWARDER}",
        str(PROXY_PORT_INSIDE),
        f"{RELAY_INSIDE}/{socket_name}",
    ]
    return [python, "-I", "-S", *inner, *argv]
