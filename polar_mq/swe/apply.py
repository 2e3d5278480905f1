"""Applying the agent's (filtered) diff to a pristine checkout, on the worker.

Why `git apply` and not copying files: it writes only the paths the patch names, refuses a path
that leads through a symlink or out of the tree, and fails as a whole when a hunk does not fit,
so the grading tree is exactly the pristine commit plus the changes the grader accepted. The
checkout is the one the grader just made (`checkout.checkout_repo`), so its configuration is
polar_mq's, never the agent's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from polar_mq.swe.git import GitError, run_git


class ApplyError(RuntimeError):
    """The patch does not apply to the pristine commit; the message is git's."""


def apply_patch(workdir: Path, patch: bytes, timeout_s: float = 120.0) -> None:
    """Apply `patch` (a `git diff --binary` against the checked-out commit) to `workdir`."""
    if not patch:
        return
    with tempfile.TemporaryDirectory(prefix="polar_mq-apply-") as scratch:
        tmp = Path(scratch)
        patch_file = tmp / "agent.patch"
        patch_file.write_bytes(patch)
        git = ["-c", "safe.directory=*", "-C", str(workdir)]
        try:
            run_git(
                [*git, "apply", "--binary", "--whitespace=nowarn", "--", str(patch_file)],
                home=tmp,
                timeout=timeout_s,
            )
        except GitError as exc:
            raise ApplyError(str(exc)) from exc
