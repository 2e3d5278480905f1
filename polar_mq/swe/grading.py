"""The agent's diff as the grader keeps it: taken once, saved on the node, outside every workspace.

Why saved: grading from the diff stops the agent's runtime before the grading runtime runs
anything (no process of the agent's is alive while it is graded), which deletes the agent's
workspace. An evaluate stage that is redelivered after that (a worker lost, the database away)
must grade the same diff again, so it is written under `<runtime root>/grading/` (mode 0700, the
worker's) before the runtime is stopped, and removed when the rollout's runtimes are released.

The base is the commit prepare recorded in its stage event (outside the workspace), never the
workspace's `refs/polar_mq/base`, which the agent can move.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from polar_mq.runtimes.janitor import GRADING_DIR
from polar_mq.swe.checkout import CheckoutError, checkout_repo
from polar_mq.swe.diff import diff_against
from polar_mq.swe.git import GitError, is_git_dir
from polar_mq.swe.spec import RepoSpec


@dataclass(frozen=True, slots=True)
class AgentDiff:
    """The agent's whole diff against the recorded base (nothing dropped yet)."""

    base: str
    patch: bytes
    files: list[str]


class DiffUnavailable(RuntimeError):
    """The agent's diff could not be taken (no saved copy and no workspace): the platform's."""


def state_paths(runtime_root: Path, runtime_id: str) -> tuple[Path, Path]:
    """Where a rollout's saved diff lives: the patch and its NUL-separated file names."""
    folder = runtime_root / GRADING_DIR
    return folder / f"{runtime_id}.patch", folder / f"{runtime_id}.files"


def load_saved(runtime_root: Path, runtime_id: str, base: str) -> AgentDiff | None:
    """The diff an earlier delivery of this evaluate saved, if any."""
    patch_path, files_path = state_paths(runtime_root, runtime_id)
    try:
        patch = patch_path.read_bytes()
        names = files_path.read_bytes().decode("utf-8", errors="surrogateescape")
    except OSError:
        return None
    return AgentDiff(base, patch, [name for name in names.split("\0") if name])


def save(runtime_root: Path, runtime_id: str, diff: AgentDiff) -> None:
    """Write the diff (names last, each by rename: a half-written pair is never read back)."""
    patch_path, files_path = state_paths(runtime_root, runtime_id)
    patch_path.parent.mkdir(parents=True, exist_ok=True)
    patch_path.parent.chmod(0o700)
    names = "\0".join(diff.files).encode("utf-8", errors="surrogateescape")
    for path, data in ((patch_path, diff.patch), (files_path, names)):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)


def forget(runtime_root: Path, runtime_id: str) -> bool:
    """Remove the saved diff; whether there was one."""
    found = False
    for path in state_paths(runtime_root, runtime_id):
        try:
            path.unlink()
            found = True
        except FileNotFoundError:
            pass
    return found


def take_diff(workdir: Path, repo: RepoSpec, base: str, timeout_s: float) -> AgentDiff:
    """The agent's work tree against `base`: with the workspace's objects when they hold it,
    else with a pristine checkout's (the agent may have removed or broken its `.git`)."""
    own = workdir / ".git"
    if own.is_dir() and not own.is_symlink() and is_git_dir(own):
        try:
            patch, files = diff_against(workdir, base, own / "objects", timeout_s)
            return AgentDiff(base, patch, files)
        except (GitError, OSError):
            pass  # the objects were tampered with: the pristine ones below
    if not workdir.is_dir():
        raise DiffUnavailable(f"the agent's workspace {workdir} is gone and no diff was saved")
    with tempfile.TemporaryDirectory(prefix="polar_mq-pristine-") as scratch:
        pristine = Path(scratch) / "repo"
        pristine.mkdir()
        try:
            checkout_repo(at_commit(repo, base), pristine, timeout_s)
            patch, files = diff_against(workdir, base, pristine / ".git" / "objects", timeout_s)
        except (CheckoutError, GitError, OSError) as exc:
            raise DiffUnavailable(f"cannot diff the agent's workspace: {exc}") from exc
    return AgentDiff(base, patch, files)


def at_commit(repo: RepoSpec, commit: str) -> RepoSpec:
    """The task's repository pinned to the commit prepare checked out."""
    return RepoSpec(repo.kind, repo.location, commit, repo.exclude)
