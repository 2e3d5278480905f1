"""Hidden tests: gathered on the worker at evaluate time and written into the grading runtime.

They live only in the job (`files`) or on the node (`path`), never in the agent's workspace or
task file, and they are written after the agent has exited, so the agent cannot read them. The
grader's copy wins: a `path` source replaces its destination directory wholesale (a conftest.py
the agent planted there is gone), `files` overwrite their paths.

`paths` rewrites absolute paths inside the test files (text files only) to workspace paths, for
suites written for a fixed container layout (Harbor's `/tests`, `/logs/verifier`, `/app`).
`{workspace}` in a replacement is the grading runtime's work directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from polar_mq.runtimes.base import Runtime
from polar_mq.swe.spec import TestsSpec

MAX_TOTAL_BYTES = 64 * 1024 * 1024


class HiddenTestsError(RuntimeError):
    """The hidden tests could not be read on this node; the message says which and why."""


def gather(spec: TestsSpec, workspace: str) -> dict[str, bytes]:
    """Workspace path → content of every hidden test file, paths already rewritten."""
    if spec.path is None:
        files = {name: text.encode() for name, text in spec.files.items()}
    else:
        files = _read_tree(Path(spec.path), spec.dest)
    if spec.paths:
        files = {name: rewrite(data, spec.paths, workspace) for name, data in files.items()}
    return files


def _read_tree(root: Path, dest: str) -> dict[str, bytes]:
    if not root.is_dir():
        raise HiddenTestsError(f"tests.path {root} is not a directory on this node")
    files: dict[str, bytes] = {}
    total = 0
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".git"))
        for filename in sorted(filenames):
            source = Path(directory) / filename
            if not source.is_file():  # a dangling link, a FIFO: nothing a test needs
                continue
            try:
                data = source.read_bytes()
            except OSError as exc:
                raise HiddenTestsError(f"cannot read hidden test {source}: {exc}") from exc
            total += len(data)
            if total > MAX_TOTAL_BYTES:
                raise HiddenTestsError(f"tests.path {root} holds more than {MAX_TOTAL_BYTES} bytes")
            files[str(Path(dest) / source.relative_to(root))] = data
    return files


def rewrite(data: bytes, paths: dict[str, str], workspace: str) -> bytes:
    """Replace each absolute path prefix (whole path components only) in a text file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    for old, new in sorted(paths.items(), key=lambda item: -len(item[0])):
        pattern = re.compile(r"(?<![\w.\-/])" + re.escape(old.rstrip("/")) + r"(?![\w.\-])")
        replacement = new.replace("{workspace}", workspace)
        text = pattern.sub(lambda _match: replacement, text)  # noqa: B023 - used at once
    return text.encode("utf-8")


def install(runtime: Runtime, spec: TestsSpec, files: dict[str, bytes], timeout_s: float) -> None:
    """Write the hidden tests into the runtime's workspace (a `path` source replaces `dest`).

    A symlink the agent left at `dest` or on the way to it is `UnsafePath` (never followed, never
    silently removed: the agent tampered with where its grader writes)."""
    if spec.path is not None:
        runtime.refuse_links(spec.dest)
        cleared = runtime.exec(["rm", "-rf", "--", spec.dest], timeout=timeout_s)
        if not cleared.ok:
            raise HiddenTestsError(
                f"cannot clear {spec.dest!r} for the hidden tests: {cleared.stderr_tail[-500:]}"
            )
    for name, data in files.items():
        runtime.upload(data, name)
