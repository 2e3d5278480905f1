"""Gathering a rollout's artifacts after its agent exited: output log, transcripts, workspace diff.

The rows are returned, not written: the run-agent stage commits them with its finish, so a stage
that is retried or lost writes them once. Every artifact is capped; a longer file keeps its tail
(where errors and final answers are) and says so.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar_mq.models.base import utcnow
from polar_mq.runtimes import Runtime
from polar_mq.swe.checkout import OWN_FILES

AGENT_LOG = "agent.log"
DIFF = "workspace.diff"
EXCLUDED_FROM_DIFF = tuple(
    f"{name}**" if name.endswith("/") else name for name in OWN_FILES if name != "answer.txt"
)
"""polar_mq's own files in the workspace (harness config and HOME, the task file, the grader's
reports, Harbor's folder): glob pathspecs from the top, never part of the diff. The answer file
stays: in a workspace the agent made a repository of, it is the agent's output (a checked-out
repository's `.git/info/exclude` leaves it out, as the graded diff does). A task graded from its
diff replaces this artifact with the graded diff (see `diff_row`)."""

_DIFF_SCRIPT = r"""
set -e
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 3
index=$(mktemp)
trap 'rm -f "$index"' EXIT
rm -f "$index"  # git refuses an empty index file; it creates its own there
export GIT_INDEX_FILE="$index"
if git rev-parse --verify -q refs/polar_mq/base >/dev/null; then base=refs/polar_mq/base
elif git rev-parse --verify -q HEAD >/dev/null; then base=HEAD
else base=$(git hash-object -t tree /dev/null); fi
case "$base" in refs/*|HEAD) git read-tree "$base";; esac
# exits 1 when an excluded path is also ignored (.git/info/exclude lists polar_mq's files):
# the other paths are staged all the same
git -c advice.addIgnoredFile=false add -A -- . EXCLUDES >/dev/null 2>&1 || true
mkdir -p .polar
git -c core.quotepath=off diff --cached --binary --no-color "$base" > .polar/workspace.diff
"""
_DIFF_FILE = ".polar/workspace.diff"


def diff_command() -> str:
    """A shell script printing the workspace's changes against its commit, new files included:
    against `refs/polar_mq/base` when polar_mq checked the repository out (the agent's commits
    show, unless it moved that ref: a task graded from its diff replaces this artifact with one
    against the base recorded outside the workspace), else against HEAD.

    It stages into a temporary index (`GIT_INDEX_FILE`), so the repository's own index, which the
    agent or the evaluator may rely on, is never touched. Exit 3: not a git work tree.
    """
    excludes = " ".join(f"':(top,exclude,glob){path}'" for path in EXCLUDED_FROM_DIFF)
    return _DIFF_SCRIPT.replace("EXCLUDES", excludes)


def may_be_work_tree(workdir: Path) -> bool:
    """Whether git could find a repository for `workdir`: a `.git` entry (a directory, a
    worktree's file, or a link) in it or in one of its parents.

    Without one `git rev-parse` can only say "not a work tree", so the diff script is not run:
    it is a process spawn (a fork of the worker, a shell and git) on every rollout whose
    workspace is no repository. Every runtime kind mounts the workspace at the same path as on
    the node, so the node's view of the path is the sandbox's.
    """
    return any(os.path.lexists(folder / ".git") for folder in (workdir, *workdir.parents))


def workspace_diff(runtime: Runtime, timeout: float = 60.0) -> bytes | None:
    """`git diff` of the workspace (with new files), or None when it is not a git repository."""
    if not may_be_work_tree(runtime.workdir):
        return None
    result = runtime.exec(diff_command(), timeout=timeout)
    if result.exit_code != 0:
        return None
    try:
        return runtime.download(_DIFF_FILE)
    except (OSError, ValueError):
        return None


def _row(
    rollout_id: uuid.UUID, attempt: int, name: str, data: bytes, cap: int, media_type: str
) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "attempt": attempt,
        "name": name,
        "media_type": media_type,
        "size": len(data),
        "truncated": len(data) > cap,
        "content": data[-cap:],
        "created_at": utcnow(),
    }


def diff_row(rollout_id: uuid.UUID, attempt: int, patch: bytes, cap: int) -> dict[str, Any]:
    """The `workspace.diff` row of a rollout graded from its diff (the evaluate stage's)."""
    return _row(rollout_id, attempt, DIFF, patch, cap, "text/x-diff")


def _tail_of_file(path: Path, cap: int) -> tuple[bytes, int] | None:
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - cap))
            return handle.read(), size
    except OSError:
        return None


def collect_artifacts(
    runtime: Runtime,
    rollout_id: uuid.UUID,
    attempt: int,
    *,
    log_path: Path | None,
    files: Mapping[str, str],
    cap: int,
) -> list[dict[str, Any]]:
    """Rows for `rollout_artifacts`: the agent log, each declared file that exists, the diff."""
    rows: list[dict[str, Any]] = []
    if log_path is not None and (tail := _tail_of_file(log_path, cap)) is not None:
        data, size = tail
        row = _row(rollout_id, attempt, AGENT_LOG, data, cap, "text/plain")
        rows.append({**row, "size": size, "truncated": size > len(data)})
    for name, relative in files.items():
        try:
            data = runtime.download(relative)
        except (OSError, ValueError):
            continue  # not written (or not a file inside the workspace): nothing to keep
        media = "application/json" if relative.endswith((".json", ".jsonl")) else "text/plain"
        rows.append(_row(rollout_id, attempt, name, data, cap, media))
    diff = workspace_diff(runtime)
    if diff:
        rows.append(_row(rollout_id, attempt, DIFF, diff, cap, "text/x-diff"))
    return rows
