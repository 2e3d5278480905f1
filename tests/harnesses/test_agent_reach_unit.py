"""Prepare refuses a `local` rollout whose agent user could not run its harness (not scored).

Real runtimes on real directories; the agent identity is `nobody`, so these need a root worker.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar_mq.harnesses.presets.setup import HarnessMissing, check_agent_reaches, preset_of
from polar_mq.runtimes import LocalRuntime
from polar_mq.runtimes.identity import NOBODY, AgentIdentity
from polar_mq.spec import HarnessSpec
from tests.conftest import runtime_id

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root worker")

AGENT = AgentIdentity(NOBODY, NOBODY, "nobody")
PRESET = HarnessSpec(type="aider")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    base = Path("/tmp") / f"pmq-reach-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def runtime(open_dir: Path) -> Iterator[LocalRuntime]:
    rt = LocalRuntime(runtime_id("rt-reach"), open_dir / "runtimes", agent=AGENT)
    rt.start()
    yield rt
    rt.stop()


def _install_dir(root: Path) -> Path:
    harness = preset_of(PRESET)
    assert harness is not None
    directory = root / harness.preset.name / harness.version
    directory.mkdir(parents=True)
    return directory


def test_preset_below_a_private_directory_is_refused(runtime: LocalRuntime, open_dir: Path) -> None:
    private = open_dir / "home"
    private.mkdir(mode=0o700)
    _install_dir(private / "harnesses")
    with pytest.raises(HarnessMissing, match="not reachable by the agent user nobody"):
        check_agent_reaches(runtime, PRESET, private / "harnesses")


def test_preset_every_user_may_reach_passes(runtime: LocalRuntime, open_dir: Path) -> None:
    _install_dir(open_dir / "harnesses")
    check_agent_reaches(runtime, PRESET, open_dir / "harnesses")
    command = HarnessSpec(type="command", command="true")
    check_agent_reaches(runtime, command, open_dir / "nowhere")
