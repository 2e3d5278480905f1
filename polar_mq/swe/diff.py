"""The workspace diff: what the agent changed since the checked-out commit, new files included.

Computed on the worker, but never with the workspace's own git configuration: the agent controls
`.git/config` and `.gitattributes`, and a filter or diff driver defined there would run its
command on the worker. So the diff uses a private, empty repository whose object store borrows
the workspace's objects (`objects/info/alternates`) and a private index: nothing of the agent's
configuration is read, the agent's index and refs are left as they were, and the work tree is only
read. Attributes naming drivers that the private repository does not define are ignored by git.

`workspace_diff` takes the base from `refs/polar_mq/base`, which the agent can move: it is what the
in-place evaluator shows. Grading from the diff (`diff_against`) takes the base prepare recorded
outside the workspace and a pristine checkout's objects instead, so a commit of the agent's shows
up in the diff, whatever it did to its refs.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from polar_mq.runtimes.safe_files import UnsafePath, read_file
from polar_mq.swe.checkout import BASE_REF, OWN_FILES
from polar_mq.swe.git import GitError, git_dir_of, run_git

DEFAULT_MAX_CHARS = 100_000
NOISE = ("__pycache__/", "*.py[co]", ".pytest_cache/")
"""What running Python or pytest leaves anywhere in a tree: never part of the diff."""
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class WorkspaceDiff:
    """The diff text (maybe truncated), the files it touches, or why there is none."""

    text: str | None
    truncated: bool = False
    files: list[str] = field(default_factory=list)
    base: str | None = None
    error: str | None = None

    def detail(self) -> dict[str, object]:
        """What an evaluation stores about the diff."""
        if self.error is not None:
            return {"diff_error": self.error}
        return {
            "diff": self.text,
            "diff_truncated": self.truncated,
            "diff_files": self.files,
            "diff_base": self.base,
        }


def base_commit(git_dir: Path) -> str | None:
    """`refs/polar_mq/base`, read as a file (loose or packed), not through git, and never through
    a link or FIFO the agent may have put there (`safe_files`: such a ref counts as missing)."""
    loose = _read_git_file(git_dir, BASE_REF).strip()
    if _SHA.fullmatch(loose):
        return loose
    for line in _read_git_file(git_dir, "packed-refs").splitlines():
        sha, _, name = line.partition(" ")
        if name.strip() == BASE_REF and _SHA.fullmatch(sha):
            return sha
    return None


def _read_git_file(git_dir: Path, name: str) -> str:
    try:
        return read_file(git_dir.parent, f"{git_dir.name}/{name}", git_dir.parent).decode(
            "utf-8", errors="replace"
        )
    except (OSError, UnsafePath):
        return ""


def workspace_diff(
    workdir: Path, max_chars: int = DEFAULT_MAX_CHARS, timeout_s: float = 120.0
) -> WorkspaceDiff:
    """`git diff` of the work tree (tracked and untracked files) against the base commit."""
    git_dir = git_dir_of(workdir)
    if git_dir is None or git_dir != workdir / ".git":
        return WorkspaceDiff(None, error="the workspace is not a git repository")
    base = base_commit(git_dir)
    if base is None:
        return WorkspaceDiff(None, error=f"no {BASE_REF} in the workspace repository")
    try:
        patch, files = diff_against(workdir, base, git_dir / "objects", timeout_s)
    except (GitError, OSError) as exc:
        return WorkspaceDiff(None, base=base, error=str(exc)[-1000:])
    text = patch.decode("utf-8", errors="replace")
    return WorkspaceDiff(text[:max_chars], len(text) > max_chars, files, base)


def diff_against(
    workdir: Path, base: str, objects: Path, timeout_s: float = 120.0
) -> tuple[bytes, list[str]]:
    """The binary patch of the work tree `workdir` against commit `base`, and the files it
    touches (same order), polar_mq's own files and Python's litter left out.

    `objects` is the object store that holds `base`: the workspace's own for the artifact, or a
    pristine checkout's when grading (then nothing of the agent's `.git` is read at all, and a
    `.git` the agent removed or rewrote changes nothing). GitError when git fails."""
    with tempfile.TemporaryDirectory(prefix="polar_mq-diff-") as scratch:
        tmp = Path(scratch)
        private = tmp / "private.git"
        run_git(["init", "-q", "--bare", str(private)], home=tmp)
        alternates = private / "objects" / "info" / "alternates"
        alternates.write_text(f"{objects.resolve()}\n")
        (private / "info").mkdir(exist_ok=True)
        excluded = [f"/{name}" for name in OWN_FILES] + list(NOISE)
        (private / "info" / "exclude").write_text("".join(f"{n}\n" for n in excluded))
        env = {"GIT_INDEX_FILE": str(tmp / "index")}
        both = [f"--git-dir={private}", f"--work-tree={workdir}", "-c", "safe.directory=*"]
        run_git([*both, "read-tree", base], home=tmp, env=env, timeout=timeout_s)
        run_git([*both, "add", "-A"], home=tmp, env=env, timeout=timeout_s)
        options = ["--no-ext-diff", "--no-textconv", "--no-color", "--no-renames"]
        names = run_git(
            [*both, "diff", "--cached", *options, "--name-only", "-z", base],
            home=tmp, env=env, timeout=timeout_s,
        )  # fmt: skip
        patch = run_git(
            [*both, "diff", "--cached", *options, "--binary", "--full-index", base],
            home=tmp, env=env, timeout=timeout_s,
        )  # fmt: skip
    files = [n for n in names.stdout.decode("utf-8", errors="replace").split("\0") if n]
    return patch.stdout, files
