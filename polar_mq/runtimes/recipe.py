"""A job's prepare recipe (`runtime.prepare {files, commands}`) and the baseline a warm runtime
goes back to when it is recycled.

The recipe is the expensive part of preparing a runtime (installing a repository, building a test
fixture), which is why the warm pool applies it ahead of time. A recycled runtime must look as if
the recipe had just run, without running it again: after the recipe the runtime's workspace and
home are copied to `<runtime dir>/warm-baseline/`, and `restore_baseline` puts that copy back after
`reset()` emptied them. The copy sits next to the sandbox, outside what `bwrap` and `docker` mount,
so an agent cannot alter it. Changes the recipe made elsewhere (a docker container's own file
system, e.g. `pip install`) survive `reset()` by themselves.
"""

from __future__ import annotations

import shutil
import time

from polar_mq.runtimes.base import Runtime
from polar_mq.runtimes.workspace_dir import space_of
from polar_mq.spec.model import PrepareRecipe

BASELINE_DIR = "warm-baseline"
_KEPT = ("workspace", "home")


class RecipeFailed(RuntimeError):
    """A recipe command exited non-zero or timed out; the message says which and why."""


def apply_recipe(runtime: Runtime, recipe: PrepareRecipe, timeout_s: float) -> float:
    """Upload the recipe's files, run its commands in order; return the seconds it took."""
    started = time.monotonic()
    for path, content in recipe.files.items():
        runtime.upload(content.encode(), path)
    for command in recipe.commands:
        result = runtime.exec(command, timeout=timeout_s)
        if result.exit_code != 0:
            raise RecipeFailed(
                f"prepare command {command!r} failed (exit {result.exit_code}, "
                f"timed out: {result.timed_out}): {result.stderr_tail[-1000:]}"
            )
    return time.monotonic() - started


def save_baseline(runtime: Runtime) -> None:
    """Copy the prepared workspace and home aside (symlinks kept as links)."""
    path = space_of(runtime).path
    base = path / BASELINE_DIR
    shutil.rmtree(base, ignore_errors=True)
    for name in _KEPT:
        shutil.copytree(path / name, base / name, symlinks=True)


def restore_baseline(runtime: Runtime) -> None:
    """Refill the (just emptied) workspace and home from the baseline; no baseline: stay empty.

    Copied into the existing directories, never replacing them: a docker container's bind mounts
    hold on to the directories themselves.
    """
    path = space_of(runtime).path
    base = path / BASELINE_DIR
    for name in _KEPT:
        source = base / name
        if source.is_dir():
            shutil.copytree(source, path / name, symlinks=True, dirs_exist_ok=True)
