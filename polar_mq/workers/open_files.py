"""A node's open-file limit, sized for the sessions its stage workers hold at once.

Each live agent session holds descriptors in its run-agent worker for as long as the agent runs:
the two pipes of its output, its pidfd, the selector that waits on them and its log file
(five, docs/multihost.md "Live sessions"). A worker with `run_agent=1024` therefore needs over
5,000 descriptors, while most systems start processes with a soft limit of 1,024; past it every
new agent fails to start (EMFILE), long before threads, memory or the database connection pools
(bounded per process, whatever the concurrency) run out.

The supervisor raises its own soft limit to what its busiest worker needs, within the hard
limit, before it starts them (they inherit it), and refuses to start when the hard limit is too
low: a node that cannot hold its concurrency says so at boot rather than failing sessions
later.
"""

from __future__ import annotations

import resource
from collections.abc import Iterable

FDS_PER_TASK = 8
"""Descriptors one running stage task may hold: the five of an agent session, with room for the
sockets and files of its stage around it."""
BASE_FDS = 256
"""A stage worker's own descriptors beside its tasks: the interpreter, the broker and database
pool sockets, log files."""


def needed(concurrencies: Iterable[int]) -> int:
    """The open-file limit the busiest of the stage workers with these concurrencies needs."""
    return BASE_FDS + FDS_PER_TASK * max(concurrencies, default=0)


def ensure(concurrencies: Iterable[int]) -> int:
    """Raise this process's soft RLIMIT_NOFILE to what `needed` says (never lower it); return
    the soft limit now in force. A ValueError when the hard limit is below it."""
    want = needed(concurrencies)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    if hard != resource.RLIM_INFINITY and hard < want:
        raise ValueError(
            f"the open-file limit is {hard} (hard), below the {want} this node's concurrency "
            f"needs ({FDS_PER_TASK} per concurrent task + {BASE_FDS}): raise it (ulimit -n, "
            "LimitNOFILE=, docker --ulimit nofile=) or lower --concurrency"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want
