"""`free_port`: a port for a service that a caller starts a moment later (the local stack, the
demo, the tests' servers).

A port checked free is not yet a port held: between the pick and the service's `bind` it can be
picked again. Three things keep the picks apart:

- Below the kernel's ephemeral range when there is room: a port the kernel picked (`bind(0)`) is
  one it also gives to outgoing connections, so a busy machine's clients (to PostgreSQL, Redis,
  the proxy) could take it before the service binds it (a proxy failed to start with "address
  already in use" that way).
- Never a port this process handed out recently (`RECENT_PORTS`): a stack asks for its ports
  (engine, proxy, API) before it starts any of them, so each is still free when the next is
  picked; two random picks of the ~22,000 ports once met (CI: the fake engine and the proxy of
  one stack both given 28397).
- A reservation other processes see (`RESERVE_S`): a file per port handed out, created only if
  absent, in a folder every polar_mq process on the machine shares. Parallel test workers each
  start stacks; without it, a port one picked could be picked by another before either bound it.
  A machine where the folder cannot be written still gets the first two.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import threading
import time
from pathlib import Path

LISTEN_PORTS_FLOOR = 10_000
RECENT_PORTS = 4_096
"""How many ports one process remembers having handed out, and never hands out again."""
RESERVE_S = 120.0
"""How long a port handed out stays reserved against other processes' picks: far longer than a
service takes to bind the port it was given."""
RESERVATIONS = Path(tempfile.gettempdir()) / "polar_mq-ports"

_handed_out: dict[int, None] = {}  # insertion-ordered: the oldest is forgotten first
_lock = threading.Lock()


def free_port() -> int:
    """A port free to listen on, not handed out recently by this or another polar_mq process."""
    with _lock:
        port = _pick()
        _handed_out[port] = None
        if len(_handed_out) > RECENT_PORTS:
            del _handed_out[next(iter(_handed_out))]
        return port


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux: 32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _pick() -> int:
    floor = _ephemeral_floor()
    if floor - LISTEN_PORTS_FLOOR >= 1_000:
        for _ in range(100):
            port = random.randrange(LISTEN_PORTS_FLOOR, floor)
            if port not in _handed_out and _bindable(port) and _reserve(port):
                return port
    port = 0
    for _ in range(100):  # no room below (or no luck): the kernel picks
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out and _reserve(port):
            return port
    return port


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _reserve(port: int) -> bool:
    """Claim `port` for `RESERVE_S` against other processes' picks: False when another process
    claimed it more recently than that. True, claiming nothing, when the folder is unusable."""
    path = RESERVATIONS / str(port)
    try:
        RESERVATIONS.mkdir(mode=0o777, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        return True
    except FileExistsError:
        pass  # claimed before: by whom, and how long ago
    except OSError:
        return True
    try:
        if time.time() - path.stat().st_mtime < RESERVE_S:
            return False
        os.utime(path)  # an old claim: its service bound the port long ago, or never will
    except FileNotFoundError:  # removed meanwhile: whoever removed it may be claiming it
        return False
    except OSError:
        return True
    return True
