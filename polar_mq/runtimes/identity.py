"""Who an agent runs as: never root, and never a user that can read the workers' processes.

Workers often run as root (containers, CI machines). An agent started with the worker's identity
could then read `/proc/<worker>/environ` (the secret that signs rollout tokens, the database URL,
the proxy admin token), the checkout and every workspace. So every runtime starts agent commands
as an unprivileged *agent identity*:

- `POLAR_MQ_AGENT_USER` (`Settings.agent_user`): a user name, or `uid` / `uid:gid`;
- unset: the dedicated user `polar-agent` when the node has it (scripts/bootstrap.sh creates it),
  else `nobody` (65534:65534).

A worker that is not root cannot switch users: its agents then run as the worker's own user, which
is said once in the log instead of failing (the operator chose to run unprivileged).

The identity is node configuration, read once per process through `get_settings()` (workers are
configured by their environment); runtimes accept an explicit one for tests and embedding.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

AGENT_USER = "polar-agent"
NOBODY = 65534


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """The uid/gid agent commands run as; `switch` is False when they keep the worker's."""

    uid: int
    gid: int
    name: str

    @property
    def switch(self) -> bool:
        """Whether starting a command as this identity means dropping the worker's privileges."""
        return self.uid != os.geteuid() or self.gid != os.getegid()

    def as_dict(self) -> dict[str, object]:
        return {"uid": self.uid, "gid": self.gid, "name": self.name}


def worker_identity() -> AgentIdentity:
    """This process's own identity (what agents get when the worker cannot switch)."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return AgentIdentity(uid, gid, name)


def parse_agent_user(value: str | None) -> AgentIdentity:
    """`None`/"" -> polar-agent or nobody; "name" -> that user; "uid[:gid]" -> those ids.

    Raises ValueError for an unknown name or uid 0 (an agent is never root)."""
    text = (value or "").strip()
    if not text:
        try:
            entry = pwd.getpwnam(AGENT_USER)
        except KeyError:
            return AgentIdentity(NOBODY, NOBODY, "nobody")
        return AgentIdentity(entry.pw_uid, entry.pw_gid, entry.pw_name)
    uid_text, _, gid_text = text.partition(":")
    if uid_text.isdigit():
        uid = int(uid_text)
        gid = int(gid_text) if gid_text.isdigit() else uid
        identity = AgentIdentity(uid, gid, _name_of(uid))
    else:
        try:
            entry = pwd.getpwnam(uid_text)
        except KeyError:
            raise ValueError(f"agent user {uid_text!r} does not exist on this node") from None
        gid = _group_id(gid_text) if gid_text else entry.pw_gid
        identity = AgentIdentity(entry.pw_uid, gid, entry.pw_name)
    if identity.uid == 0 or identity.gid == 0:
        raise ValueError("the agent user must not be root (uid and gid 0 are refused)")
    return identity


def resolve(value: str | None) -> AgentIdentity:
    """The identity agents run as on this node, given the configured `agent_user`."""
    if os.geteuid() != 0:
        me = worker_identity()
        say_once(
            f"the worker runs as {me.name} (uid {me.uid}), not root: it cannot switch users, so "
            "agents run as the worker's own user"
        )
        return me
    return parse_agent_user(value)


@lru_cache(maxsize=1)
def node_identity() -> AgentIdentity:
    """The configured identity of this process's node (`POLAR_MQ_AGENT_USER`), resolved once."""
    from polar_mq.config import get_settings  # config imports nothing of the runtimes

    return resolve(get_settings().agent_user)


def can_reach(path: Path, identity: AgentIdentity) -> bool:
    """Whether `identity` can walk down to `path` (search permission on every ancestor).

    Checked before dropping privileges under `local`: a workspace below a private directory
    (a 0700 home, pytest's temporary root) would leave the agent unable to open its own files.
    """
    current = Path(path).resolve()
    for directory in [*reversed(current.parents), current]:
        try:
            info = directory.stat()
        except OSError:
            return False
        if not may_search(info, identity):
            return False
    return True


def may_search(info: os.stat_result, identity: AgentIdentity) -> bool:
    """Whether `identity` may enter a directory with this status (its permission bits)."""
    if identity.uid == 0:
        return True
    if info.st_uid == identity.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == identity.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def chown_tree(path: Path, identity: AgentIdentity) -> None:
    """Give `path` and everything below it to the agent (no-op when nobody switches).

    Symlinks are changed themselves, never followed: an agent-made link must not hand it files
    outside the sandbox."""
    if not identity.switch or not path.exists():
        return
    os.lchown(path, identity.uid, identity.gid)
    if path.is_symlink() or not path.is_dir():
        return
    for parent, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(parent, name), identity.uid, identity.gid)


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_id(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise ValueError(f"agent group {text!r} does not exist on this node") from None


_said: set[str] = set()


def say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning(message)
