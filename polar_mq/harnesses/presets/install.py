"""Installing a preset's harness once per node, into a versioned cache a rollout never writes to.

Layout: `<harness_root>/<preset>/<version>/` holds an npm prefix (`node_modules/.bin/...`) or a
virtualenv (`venv/bin/...`), and `installed.json` written last: a directory without it is a failed
or running install, never used. Installs of one preset and version are serialised by a file lock,
so concurrent workers with `auto_install` install once and the others wait and reuse it.

Nothing here reaches the network except the package registries (npm, PyPI) through their own
clients, whose caches (`~/.npm`, `~/.cache/pip`) make a reinstall fast.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from polar_mq.harnesses.presets.base import Ecosystem, Install, Package

MARKER = "installed.json"


class InstallError(RuntimeError):
    """The registry client failed; the message carries the tail of its output."""


def install_dir(root: Path, name: str, version: str) -> Path:
    return root / name / version


def find_install(root: Path, name: str, package: Package, version: str) -> Install | None:
    """The completed install of `name` at `version`, or None."""
    directory = install_dir(root, name, version)
    if not (directory / MARKER).is_file():
        return None
    return Install.at(directory, package.ecosystem)


def installed_versions(root: Path, name: str) -> list[str]:
    """Versions of `name` with a completed install on this node."""
    base = root / name
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / MARKER).is_file())


@contextmanager
def _locked(root: Path, name: str, version: str) -> Iterator[None]:
    root.joinpath(name).mkdir(parents=True, exist_ok=True)
    with open(root / name / f".{version}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True, slots=True)
class InstallReport:
    install: Install
    seconds: float
    cached: bool


def install(
    root: Path,
    name: str,
    package: Package,
    version: str,
    log: Callable[[str], None] = lambda _line: None,
) -> InstallReport:
    """Install `package` at `version` unless it is already there; safe to call concurrently."""
    started = time.monotonic()
    with _locked(root, name, version):
        found = find_install(root, name, package, version)
        if found is not None:
            return InstallReport(found, time.monotonic() - started, cached=True)
        directory = install_dir(root, name, version)
        if directory.exists():
            shutil.rmtree(directory)  # a previous install died half-way
        directory.mkdir(parents=True)
        steps = _npm_steps if package.ecosystem is Ecosystem.NPM else _pypi_steps
        for argv in steps(directory, package, version):
            log("$ " + " ".join(argv))
            _run(argv, directory)
        marker = {"name": name, "package": package.name, "version": version}
        (directory / MARKER).write_bytes(orjson.dumps(marker))
    return InstallReport(
        Install.at(directory, package.ecosystem), time.monotonic() - started, False
    )


def _npm_steps(directory: Path, package: Package, version: str) -> list[list[str]]:
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError("npm is not on PATH: install Node.js 20+ on this node")
    specs = [f"{package.name}@{version}", *package.also]
    flags = ["--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(directory)]
    return [[npm, "install", *flags, *specs]]


def _pypi_steps(directory: Path, package: Package, version: str) -> list[list[str]]:
    venv = directory / "venv"
    python = str(venv / "bin" / "python")
    spec = f"{package.name}{package.extras}=={version}"
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    base = find_python(package.python, package.name) if package.python else _base_python()
    return [[base, "-m", "venv", str(venv)], [*pip, spec, *package.also]]


def _base_python() -> str:
    """The interpreter new venvs are made from: the worker's own base interpreter."""
    return getattr(sys, "_base_executable", None) or sys.executable


def python_candidates(version: str) -> list[str]:
    """Where a `pythonX.Y` may be: PATH, the usual prefixes, then pyenv's installed versions
    (pyenv's shims on PATH fail for a version that is not selected, so its builds are tried by
    their own path)."""
    program = f"python{version}"
    found = [shutil.which(program), f"/usr/local/bin/{program}", f"/usr/bin/{program}"]
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    builds = sorted((pyenv_root / "versions").glob(f"{version}.*/bin/{program}"), reverse=True)
    found += [str(build) for build in builds]
    return list(dict.fromkeys(path for path in found if path))


def find_python(version: str, package: str) -> str:
    """A working `python<version>` with venv for a harness that needs it, or InstallError."""
    probe = "import sys, venv; print('%d.%d' % sys.version_info[:2])"
    candidates = python_candidates(version)
    for candidate in candidates:
        try:
            proc = subprocess.run(
                [candidate, "-c", probe], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return candidate
    tried = ", ".join(candidates) or f"python{version} (not on PATH)"
    raise InstallError(
        f"{package} needs Python {version}, which this node lacks (tried: {tried}); install "
        f"python{version} (on PATH, or a pyenv build under $PYENV_ROOT/versions)"
    )


def _run(argv: list[str], cwd: Path) -> None:
    env = {**os.environ, "npm_config_update_notifier": "false", "PIP_NO_INPUT": "1"}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise InstallError(f"{argv[0]} exited {proc.returncode}: {tail}")
