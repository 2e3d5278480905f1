"""Check a task's repository out into a rollout's workspace (the prepare stage's part).

Why on the worker and not inside the sandbox: every runtime kind keeps its workspace on the node
(bwrap binds it, docker bind mounts it at the same path), and images need not ship git. The
sources are the job submitter's, so reading them here is no more trust than reading the job.

What the agent gets: a fresh repository in its workspace holding only the history up to the
requested commit, on branch `main`, with no remote (it cannot fetch the fix from a later commit of
the source, nor learn the source's node path). `refs/polar_mq/base` marks the commit the diff is
taken against, and `.git/info/exclude` keeps polar_mq's own files (task.json, answer.txt) out of
`git status` and of the diff. A plain directory or tarball without `.git` is imported as a single
commit with a fixed author and date, so every node derives the same sha from the same tree.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from polar_mq.swe.git import GitError, git_dir_of, run_git
from polar_mq.swe.spec import RepoSpec

BASE_REF = "refs/polar_mq/base"
BRANCH = "main"
OWN_FILES = ("task.json", "answer.txt", ".polar_mq-junit-*.xml", ".harbor/", ".polar/")
"""polar_mq's files in the workspace (root only), never part of the repository's diff: the task
and answer files, the grader's reports, Harbor's folder, the harnesses' HOME and config."""
_SAFE = ("-c", "safe.directory=*")  # the submitter's repository may belong to another user


class CheckoutError(RuntimeError):
    """The repository could not be checked out; the message is the rollout's failure reason."""


@dataclass(frozen=True, slots=True)
class Checkout:
    """What prepare records about a checkout."""

    commit: str
    source: str
    seconds: float


def checkout_repo(spec: RepoSpec, workdir: Path, timeout_s: float = 300.0) -> Checkout:
    """Put the commit `spec` names into `workdir` (which may already hold other files)."""
    started = time.monotonic()
    if (workdir / ".git").exists():
        raise CheckoutError(f"the workspace already holds a .git ({workdir}); refusing to replace")
    with tempfile.TemporaryDirectory(prefix="polar_mq-repo-") as scratch:
        tmp = Path(scratch)
        home = tmp / "home"
        home.mkdir()
        try:
            source = _materialize(spec, tmp, home, timeout_s)
            commit = _resolve(source, spec.commit, home)
            _install(workdir, source, commit, home, timeout_s)
        except GitError as exc:
            raise CheckoutError(f"repo.{spec.kind} {spec.location}: {exc}") from exc
    return Checkout(commit, f"{spec.kind}:{spec.location}", round(time.monotonic() - started, 4))


def _materialize(spec: RepoSpec, tmp: Path, home: Path, timeout_s: float) -> Path:
    """A repository (work tree or bare) holding the source's commits, readable by `git fetch`."""
    location = Path(spec.location)
    where = f"repo.{spec.kind} {location}"
    if spec.kind == "path":
        if not location.is_dir():
            raise CheckoutError(f"{where} is not a directory on this node")
        if (location / ".git").exists() or git_dir_of(location) is not None:
            return location
        return _import_tree(location, tmp / "import.git", spec.exclude, home, timeout_s)
    if not location.is_file():
        raise CheckoutError(f"{where} is not a file on this node")
    if spec.kind == "bundle":
        bare = tmp / "bundle.git"
        run_git(["clone", "--bare", "-q", str(location), str(bare)], home=home, timeout=timeout_s)
        return bare
    tree = tmp / "tree"
    try:
        with tarfile.open(location, mode="r:*") as archive:
            archive.extractall(tree, filter="data")  # no absolute paths, links out or devices
    except (tarfile.TarError, OSError) as exc:
        raise CheckoutError(f"{where}: cannot extract: {exc}") from exc
    entries = list(tree.iterdir()) if tree.is_dir() else []
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else tree
    if (root / ".git").exists():
        return root
    return _import_tree(root, tmp / "import.git", spec.exclude, home, timeout_s)


def _import_tree(
    tree: Path, git_dir: Path, exclude: tuple[str, ...], home: Path, timeout_s: float
) -> Path:
    """One commit of a plain tree, made without copying it (the tree is only read)."""
    tree.mkdir(parents=True, exist_ok=True)
    run_git(["init", "-q", "--bare", str(git_dir)], home=home)
    (git_dir / "info").mkdir(exist_ok=True)
    (git_dir / "info" / "exclude").write_text("".join(f"/{name}\n" for name in exclude))
    both = [f"--git-dir={git_dir}", f"--work-tree={tree}"]
    run_git([*_SAFE, *both, "add", "-A"], home=home, timeout=timeout_s)
    run_git(
        [*both, "commit", "-q", "--allow-empty", "-m", "polar_mq: import the task's files"],
        home=home,
    )
    return git_dir


def _resolve(source: Path, commit: str | None, home: Path) -> str:
    wanted = commit or "HEAD"
    for candidate in (wanted, f"refs/remotes/origin/{wanted}"):
        done = run_git(
            [*_SAFE, "rev-parse", "--verify", "-q", "--end-of-options", f"{candidate}^{{commit}}"],
            home=home,
            cwd=source,
            check=False,
        )
        if done.returncode == 0:
            return done.stdout.decode().strip()
    raise CheckoutError(f"commit {wanted!r} is not in the repository at {source}")


def _install(workdir: Path, source: Path, commit: str, home: Path, timeout_s: float) -> None:
    """A new repository in the workspace with only `commit` and its history, checked out."""
    # the workspace belongs to the agent user (not root): without the exception git refuses it
    # as "dubious ownership"; safe, the repository is the one made here (a .git already there is
    # refused above) and no agent command has run in it yet
    git = [*_SAFE, "-C", str(workdir)]
    run_git([*git, "init", "-q", "-b", BRANCH], home=home)
    run_git(
        [*git, "fetch", "-q", "--no-tags", "--", str(source), commit],
        home=home,
        timeout=timeout_s,
    )
    (workdir / ".git" / "FETCH_HEAD").unlink(missing_ok=True)  # it names the source's path
    run_git([*git, "update-ref", BASE_REF, commit], home=home)
    run_git([*git, "checkout", "-q", "-f", "-B", BRANCH, commit], home=home, timeout=timeout_s)
    run_git([*git, "config", "user.name", "polar_mq agent"], home=home)
    run_git([*git, "config", "user.email", "agent@polar_mq.localhost"], home=home)
    exclude = workdir / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with exclude.open("a") as handle:
        handle.write("".join(f"/{name}\n" for name in OWN_FILES))
