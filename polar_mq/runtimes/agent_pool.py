"""One agent user per live `local` runtime, so rollouts on one node cannot read each other.

Under `local` nothing but the uid separates two agents of a node: with one shared agent user, an
agent could read another rollout's workspace (its task, its hidden files once copied, its answer)
and signal or trace its processes. A root worker therefore gives each runtime its own user from a
*pool* of unprivileged users named `polar-agent-1`, `polar-agent-2`, ... (created ahead by
`scripts/bootstrap.sh`, `POLAR_MQ_AGENT_POOL_SIZE`, or by the operator with `useradd`; real
passwd entries, because harnesses such as Claude Code and Gemini CLI look their user up).

Which runtime holds which user is recorded on disk (`Settings.agent_claims_dir`, one file per
uid naming the runtime directory), under a node-wide file lock, because the stages of one rollout
run in different worker processes. A claim is stale, and taken over, when its runtime directory
is gone or records another user (a worker died before `stop()`). When every pool user is busy,
the runtime falls back to the node's shared agent user and says so once: size the pool at least
to the node's worker slots plus its warm pool.

A free user is handed out only when no process of it is alive (`uid_sweep`): its last holder's
`stop()` kills them all, and what is found here anyway (a worker died before the stop) is killed
first. A user whose process survives that is *quarantined* (a claim file naming no runtime) and
never handed out again until an operator looks at it (`QUARANTINE`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
from collections.abc import Iterator
from pathlib import Path

from polar_mq.runtimes import uid_sweep
from polar_mq.runtimes.identity import AgentIdentity, say_once

POOL_PREFIX = "polar-agent-"
_MEMBER = re.compile(rf"^{re.escape(POOL_PREFIX)}(\d+)$")
_LOCK_FILE = ".lock"
_META_FILE = "runtime.json"
QUARANTINE = "quarantined: a process of this user survived SIGKILL"
"""The claim of a quarantined user: no runtime holds it, and no runtime may take it."""


_PASSWD = "/etc/passwd"
_members_cache: tuple[tuple[int, int, int], list[AgentIdentity]] | None = None


def pool_members() -> list[AgentIdentity]:
    """The node's pool users in pool order (never uid or gid 0).

    Read again only when the passwd file changed (`useradd` rewrites it): every prepare and every
    release asks, and walking the whole user database each time cost more than the claim itself.
    """
    global _members_cache
    try:
        st = os.stat(_PASSWD)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        return _read_pool_members()  # no passwd file (another NSS source): never cached
    cached = _members_cache
    if cached is not None and cached[0] == stamp:
        return list(cached[1])
    members = _read_pool_members()
    _members_cache = (stamp, members)
    return list(members)


def _read_pool_members() -> list[AgentIdentity]:
    members: list[tuple[int, AgentIdentity]] = []
    for entry in pwd.getpwall():
        match = _MEMBER.match(entry.pw_name)
        if match and entry.pw_uid != 0 and entry.pw_gid != 0:
            members.append(
                (int(match.group(1)), AgentIdentity(entry.pw_uid, entry.pw_gid, entry.pw_name))
            )
    return [identity for _, identity in sorted(members, key=lambda item: item[0])]


class AgentPool:
    """Claims and releases pool users for runtime directories (safe across worker processes)."""

    def __init__(self, claims_dir: Path, members: list[AgentIdentity] | None = None) -> None:
        self.claims_dir = Path(claims_dir)
        self.members = pool_members() if members is None else members

    def claim(self, runtime_path: Path) -> AgentIdentity | None:
        """A pool user for `runtime_path` (the one it already holds, if any); None when busy."""
        if not self.members:
            return None
        holder_of = str(runtime_path)
        with self._locked():
            claimed = self._claim_files()
            free: AgentIdentity | None = None
            for member in self.members:
                holder = self._holder(member) if str(member.uid) in claimed else None
                if holder == holder_of:
                    return member
                unheld = holder is None or not _still_held(holder, member)
                if free is None and unheld and self._vacant(member):
                    free = member
            if free is not None:
                self._write(free, holder_of)
                return free
        say_once(
            f"all {len(self.members)} agent pool users are busy: this runtime's agent shares "
            "the node's agent user with others; make the pool at least as large as the node's "
            "worker slots plus its warm pool (POLAR_MQ_AGENT_POOL_SIZE in scripts/bootstrap.sh)"
        )
        return None

    def _vacant(self, member: AgentIdentity) -> bool:
        """Whether no process of `member` is alive, after killing the leftovers of a holder that
        never stopped; quarantine the user when one survives (its claim names no runtime)."""
        if member.uid in (0, os.geteuid()):
            return True  # never swept: that would be the worker itself
        if not uid_sweep.pids_of(member.uid, setuid_root=False):  # a stat per process: cheap
            return True
        survivors = uid_sweep.kill_uid(member.uid, deadline_s=5.0)
        if not survivors:
            return True
        self._write(member, QUARANTINE)
        say_once(
            f"agent pool user {member.name} (uid {member.uid}) is quarantined: processes "
            f"{survivors} survived SIGKILL; it is not handed out again until its claim file "
            f"{self.claims_dir / str(member.uid)} is removed"
        )
        return False

    def holder(self, uid: int) -> str | None:
        """The runtime directory holding `uid` (or `QUARANTINE`); None when nobody does."""
        with self._locked():
            return self._holder_uid(uid)

    def release(self, runtime_path: Path, uid: int) -> None:
        """Give the user back, if `runtime_path` still holds it."""
        with self._locked():
            for member in self.members:
                if member.uid == uid and self._holder(member) == str(runtime_path):
                    (self.claims_dir / str(uid)).unlink(missing_ok=True)

    def _claim_files(self) -> set[str]:
        """The names in the claims directory: a member without a file is free, unread (one
        listing instead of a read per member of the pool on every claim)."""
        try:
            return set(os.listdir(self.claims_dir))
        except OSError:
            return set()

    def _holder(self, member: AgentIdentity) -> str | None:
        return self._holder_uid(member.uid)

    def _holder_uid(self, uid: int) -> str | None:
        try:
            return (self.claims_dir / str(uid)).read_text()
        except OSError:
            return None

    def _write(self, member: AgentIdentity, holder: str) -> None:
        path = self.claims_dir / str(member.uid)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(holder)
        os.replace(tmp, path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.claims_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.claims_dir / _LOCK_FILE, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _still_held(holder: str, member: AgentIdentity) -> bool:
    """Whether the runtime named by a claim still exists and has not recorded another user.

    A runtime that exists without its record yet is being started (it claims before it writes)."""
    if holder == QUARANTINE:
        return True
    runtime = Path(holder)
    if not runtime.is_dir():
        return False
    try:
        recorded = json.loads((runtime / _META_FILE).read_text()).get("agent")
    except (OSError, ValueError, AttributeError):
        return True
    return not isinstance(recorded, dict) or int(recorded.get("uid", -1)) == member.uid
