"""The in-sandbox half of `network: proxy_only`: 127.0.0.1:<port> relayed to a Unix socket.

A sandbox with `proxy_only` has its own network namespace with nothing but loopback, so it can
reach no TCP address of the node: not PostgreSQL, not Redis, not the internet, and not the proxy
either. The one way out is a Unix socket bound into the sandbox, served outside by the worker's
relay (`proxy_relay.py`), which connects to the proxy and nowhere else. Agents speak TCP to a
base URL, so this program listens on loopback inside the sandbox and relays each connection to
that socket.

Run as the command's wrapper: `python -I -S forwarder.py PORT SOCKET COMMAND...`. It binds the
port first (so the agent never races it), forks the relay into the background with its standard
streams closed (the command's output pipes end with the command), and then becomes COMMAND, so the
command keeps its pid, its exit status and its signals. The relay ends when the command exits:
under bwrap the sandbox's pid namespace ends with it; a docker container outlives its commands,
so the relay also asks the kernel for SIGKILL when its parent (the command) dies and checks its
parent between accepts. A port still held by a previous command's relay (in the instant it takes
to die) is waited for, briefly.

Standard library only and no polar_mq imports: it runs with any interpreter the sandbox has.
`relay_pair` is also what the outside relay uses.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import threading
import time

_CHUNK = 65536
_PARENT_POLL_S = 0.2
_BIND_WAIT_S = 10.0
_PR_SET_PDEATHSIG = 1


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy one direction until EOF, then pass the EOF on (HTTP clients wait for it)."""
    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def relay_pair(client: socket.socket, upstream: socket.socket) -> None:
    """Relay both directions between two connected sockets, then close both."""
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, path: str, parent: int) -> None:
    listener.settimeout(_PARENT_POLL_S)
    while os.getppid() == parent:
        try:
            client, _ = listener.accept()
        except socket.timeout:  # noqa: UP041 - TimeoutError only from Python 3.10 (images vary)
            continue
        client.settimeout(None)
        threading.Thread(target=_connect, args=(client, path), daemon=True).start()


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` exits (Linux; the accept loop's check covers the rest)."""
    with contextlib.suppress(Exception):  # no ctypes or no libc: the loop's check still holds
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(0)


def _listen(port: int) -> socket.socket:
    """Bind 127.0.0.1:port, waiting out the relay of a command that has just ended."""
    deadline = time.monotonic() + _BIND_WAIT_S
    while True:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", port))
        except OSError as exc:
            listener.close()
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                sys.exit(f"forwarder: cannot listen on 127.0.0.1:{port}: {exc.strerror}")
            time.sleep(0.05)
            continue
        listener.listen(128)
        return listener


def _connect(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    relay_pair(client, upstream)


def main(argv: list[str]) -> None:
    if argv[1:] == ["--check"]:  # the runtime's probe: this interpreter can run the forwarder
        return
    if len(argv) < 4:
        sys.exit("usage: forwarder.py PORT SOCKET COMMAND...")
    port, path, command = int(argv[1]), argv[2], argv[3:]
    listener = _listen(port)
    parent = os.getpid()
    if os.fork() == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # first: the command's output ends when the command does
            os.dup2(devnull, fd)
        _die_with_parent(parent)
        try:
            _serve(listener, path, parent)
        finally:
            os._exit(0)
    listener.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"{command[0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv)
