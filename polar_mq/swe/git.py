"""Running `git` on the worker with an environment polar_mq controls.

Why a wrapper: git reads the user's and the system's configuration and, in a repository, the
repository's own. The worker's must not leak into checkouts (a global `core.autocrlf`, hooks, a
credential helper), commits made for an import must be reproducible (fixed author and date, so the
same plain directory gives the same commit on every node), and no command may wait for a terminal.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

IDENTITY = "polar_mq"
EMAIL = "polar_mq@localhost"
EPOCH = "2000-01-01T00:00:00+0000"
OUTPUT_LIMIT = 4000


class GitError(RuntimeError):
    """A git command failed; the message holds the command and the end of its stderr."""


def git_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """No system or global config, a throwaway HOME, a fixed identity and clock, no prompts."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": IDENTITY,
        "GIT_AUTHOR_EMAIL": EMAIL,
        "GIT_AUTHOR_DATE": EPOCH,
        "GIT_COMMITTER_NAME": IDENTITY,
        "GIT_COMMITTER_EMAIL": EMAIL,
        "GIT_COMMITTER_DATE": EPOCH,
    }
    env.update(extra or {})
    return env


def run_git(
    args: Sequence[str],
    *,
    home: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """`git -c core.hooksPath=/dev/null ARGS`; GitError when it fails or times out."""
    argv = ["git", "-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false", *args]
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=git_env(home, env),
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise GitError(f"git {' '.join(args[:3])} timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise GitError(f"cannot run git: {exc}") from exc
    if check and done.returncode != 0:
        stderr = done.stderr.decode(errors="replace").strip()[-OUTPUT_LIMIT:]
        raise GitError(f"git {' '.join(args[:3])} failed (exit {done.returncode}): {stderr}")
    return done


def is_git_dir(path: Path) -> bool:
    """A bare repository or a `.git` directory (HEAD, objects and refs inside)."""
    return (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir()


def git_dir_of(path: Path) -> Path | None:
    """The git directory of a work tree or bare repository at `path`, never of a parent."""
    if (path / ".git").is_dir() and is_git_dir(path / ".git"):
        return path / ".git"
    if is_git_dir(path):
        return path
    return None
