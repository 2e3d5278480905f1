"""Making sure a rollout's preset is installed on the node that runs it (the prepare stage).

A missing install fails the rollout at prepare with the command that fixes it, instead of an agent
that dies with "command not found" and is scored; with `auto_install` the node installs it once
(under the install lock, so concurrent rollouts wait for one install).
"""

from __future__ import annotations

import sys
from pathlib import Path

from polar_mq.config import get_settings
from polar_mq.harnesses import get_harness
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.install import (
    MARKER,
    InstallError,
    find_install,
    install,
    install_dir,
)
from polar_mq.runtimes import LocalRuntime, Runtime
from polar_mq.runtimes.identity import can_reach
from polar_mq.runtimes.private_view import reachable_in_view
from polar_mq.spec.model import HarnessSpec, RuntimeSpec

IMAGE_HARNESS_ROOT = Path("/opt/polar_mq/harnesses")
"""Where scripts/build_preset_image.sh installs presets inside a docker image."""


def harness_root_for(runtime_spec: RuntimeSpec, node_root: Path) -> Path:
    """Where the agent finds installed presets: in the image for `docker`, else on the node."""
    return IMAGE_HARNESS_ROOT if runtime_spec.kind == "docker" else node_root


def preset_of(harness_spec: HarnessSpec) -> PresetHarness | None:
    if not harness_spec.is_preset:
        return None
    harness = get_harness(harness_spec)
    return harness if isinstance(harness, PresetHarness) else None


def sandbox_binds(
    runtime_spec: RuntimeSpec, harness_spec: HarnessSpec, node_root: Path
) -> tuple[str, ...]:
    """What a sandbox mounts read-only beyond its own defaults: a `bwrap` sandbox also sees the
    install of the job's preset, which lives outside the system directories it binds (the
    runtime's `ro_binds`, see `polar_mq.runtimes.options.runtime_from_spec`)."""
    harness = preset_of(harness_spec)
    if harness is None or runtime_spec.kind != "bwrap":
        return ()
    directory = install_dir(node_root, harness.preset.name, harness.version)
    return (str(directory), *_venv_base(directory))


def _venv_base(directory: Path) -> list[str]:
    """The prefix of the interpreter a PyPI install's venv was made from, when it is not the
    worker's own (bwrap binds that one already): a preset that needs a newer Python
    (`Package.python`, e.g. openhands_sdk on 3.12) has a venv whose `python` is a symlink to it."""
    config = directory / "venv" / "pyvenv.cfg"
    try:
        lines = config.read_text().splitlines()
    except OSError:
        return []  # an npm install, or none yet (prepare refuses a missing install)
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            prefix = Path(value.strip()).parent  # home is the interpreter's bin directory
            mine = prefix in (Path(sys.base_prefix), Path("/"))  # never the whole root
            return [] if mine else [str(prefix)]
    return []


def check_in_image(runtime: Runtime, harness_spec: HarnessSpec, image: str) -> None:
    """Under `docker`, the preset must be baked into the image (HarnessMissing otherwise)."""
    harness = preset_of(harness_spec)
    if harness is None:
        return
    directory = install_dir(IMAGE_HARNESS_ROOT, harness.preset.name, harness.version)
    found = runtime.exec(["test", "-f", str(directory / MARKER)], timeout=30)
    if found.exit_code != 0:
        label = f"{harness.preset.name}@{harness.version}"
        raise HarnessMissing(
            f"image {image} has no harness {label} (no {directory}): build one with "
            f"`bash scripts/build_preset_image.sh {label}` and use it as runtime.image"
        )


class HarnessMissing(RuntimeError):
    """The preset is not installed here (and the job did not ask for `auto_install`), or the
    agent user cannot reach it."""


def check_agent_reaches(runtime: Runtime, harness_spec: HarnessSpec, root: Path) -> None:
    """Under `local` the agent user runs the preset's install (or the reference agent's
    interpreter) by its node path: one below a private directory (root's 0700 home) would make
    every agent die with "permission denied" and be scored; refuse the rollout at prepare
    instead (HarnessMissing). The agent's private view (`private_view`) makes the interpreter and
    `harness_root` reachable there. `bwrap` and `docker` mount what they run themselves."""
    if type(runtime) is not LocalRuntime or not runtime.agent.switch:
        return
    harness = preset_of(harness_spec)
    if harness is not None:
        needed = install_dir(root, harness.preset.name, harness.version)
        what = f"harness {harness.preset.name}@{harness.version} (installed in {needed})"
    elif harness_spec.type == "reference":
        needed = Path(runtime.python).resolve().parent
        what = f"the reference agent's interpreter ({needed})"
    else:
        return
    agent = runtime.agent
    if not can_reach(needed, agent) and not reachable_in_view(needed, agent, get_settings()):
        raise HarnessMissing(
            f"{what} is not reachable by the agent user {agent.name} (uid {agent.uid}): a "
            "parent directory is private. Install it below directories every user may enter "
            "(e.g. POLAR_MQ_HARNESS_ROOT=/opt/polar_mq/harnesses), or use the bwrap runtime, "
            "which mounts it itself"
        )


def ensure_installed(harness_root: Path, harness_spec: HarnessSpec, node: str) -> str | None:
    """None for non-preset harnesses; else `name@version` once it is installed on this node.

    (Under `docker` the image holds the install: see `check_in_image`.)"""
    harness = preset_of(harness_spec)
    if harness is None:
        return None
    preset, version = harness.preset, harness.version
    label = f"{preset.name}@{version}"
    if find_install(harness_root, preset.name, preset.package, version) is not None:
        return label
    if not harness.auto_install:
        raise HarnessMissing(
            f"harness {label} is not installed on node {node} (under {harness_root}): run "
            f"`polar-mq harness install {label}` there, or set harness.auto_install: true"
        )
    try:
        install(harness_root, preset.name, preset.package, version)
    except InstallError as exc:
        raise HarnessMissing(f"installing harness {label} on node {node} failed: {exc}") from exc
    return label
