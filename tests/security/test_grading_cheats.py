"""Rewards that cannot be gamed: every way issue 32 found to pass hidden tests without fixing
anything scores what doing nothing scores, on local, bwrap and docker.

Scenario: a held-out task (a repository `calc/` with `mul` wrong, two hidden tests, one of which
passes untouched: doing nothing scores 0.5) handed to real agent subprocesses (`cheat_agent.py`,
a `command` harness) that plant a root `conftest.py`, `addopts = -p plugin` in each pytest
configuration file, a `pytest/` package shadowing the runner, a `*.dist-info` with a `pytest11`
entry point, a module patching `_pytest` imported from `tests/__init__.py` and a `.pth`, a `.pth`
in the user site, a daemon rewriting the hidden tests after the agent exits, and a commit hidden
by moving `refs/polar_mq/base`. Before, each scored 1.0 (graded in the agent's own workspace and
runtime). Now the `tests` evaluator grades from the agent's diff against the base prepare
recorded, applied to a pristine checkout in a fresh runtime without test files and test
configuration: each scores 0.5, the dropped files are listed as `tampering`, the honest agents
(one of which commits its fix and moves the ref) score 1.0, and the stored `workspace.diff`
holds the agent's changes but none of polar_mq's own files.

All rollouts of one runtime kind go in one job on one stack shared by the module.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import make_session_factory
from polar_mq.models import Evaluation, RolloutArtifact
from polar_mq.rollouts.artifacts import DIFF
from tests.conftest import module_database
from tests.reliability.support import RelStack, check_invariants, rel_stack, wait_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

pg_url, pg_engine = module_database("polar_mq_grading_cheats")

AGENT = Path(__file__).with_name("cheat_agent.py")
COMMAND = (
    '{python} -c \'import json; exec(compile(json.load(open("task.json"))["script"], '
    '"cheat_agent", "exec"))\''
)
BUGGY = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
HIDDEN = (
    "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n"
)
NAMES = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_mul"]
HONEST = ("honest", "honest_commit")
FLAGGED = {
    "conftest": "conftest.py",
    "addopts_ini": "pytest.ini",
    "addopts_pyproject": "pyproject.toml",
    "addopts_setupcfg": "setup.cfg",
    "addopts_tox": "tox.ini",
    "pytest_shadow": "pytest/__main__.py",
    "dist_info": "cheat-1.0.dist-info/entry_points.txt",
    "runner_patch": "tests/__init__.py",
    "git_base": "conftest.py",
}
"""The cheats whose files are in the workspace, and one file each that must be dropped."""
UNFLAGGED = ("user_site", "daemon")
"""Cheats that leave nothing in the repository: they simply have no effect any more."""
CHEATS = (*FLAGGED, *UNFLAGGED)
DOCKER_BASE = "polar-mq-runtime:test"
DOCKER_IMAGE = "polar-mq-runtime:grading-cheats"
PYTEST_PACKAGES = ("pytest", "_pytest", "py.py", "pluggy", "iniconfig", "packaging", "pygments")


@pytest.fixture(scope="module")
def rel(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelStack]:
    with rel_stack(pg_url, tmp_path_factory.mktemp("stack")) as stack:
        yield stack


@pytest.fixture(scope="module")
def sessions(pg_engine: Any) -> sessionmaker[Session]:
    return make_session_factory(pg_engine)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The task's repository: a plain tree, imported by prepare as one commit."""
    root = tmp_path_factory.mktemp("calc_repo")
    (root / "calc").mkdir()
    (root / "calc" / "__init__.py").write_text(BUGGY)
    (root / "README").write_text("multiply correctly\n")
    return root


def _docker_image() -> str:
    """The test image plus pytest (copied from this venv) and git (from this node: same Debian):
    what a SWE task's image holds."""
    from polar_mq.runtimes.docker import default_client, docker_available

    reason = docker_available()
    if reason is None and not default_client().images.list(name=DOCKER_BASE):
        reason = f"image {DOCKER_BASE} missing: run scripts/build_test_image.sh"
    if reason is not None:
        pytest.skip(f"docker runtime unavailable: {reason}")
    site = Path(pytest.__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp)
        for entry in site.iterdir():
            stem = entry.name.split("-")[0]
            if entry.name in PYTEST_PACKAGES or (
                entry.name.endswith(".dist-info") and stem in PYTEST_PACKAGES
            ):
                copy = shutil.copytree if entry.is_dir() else shutil.copy2
                copy(entry, context / "site" / entry.name)
        git = shutil.which("git")
        assert git is not None
        shutil.copy2(git, context / "git")
        (context / "Dockerfile").write_text(
            f"FROM {DOCKER_BASE}\nCOPY site/ /usr/local/lib/python3.11/dist-packages/\n"
            "COPY git /usr/local/bin/git\n"
        )
        subprocess.run(["docker", "build", "-q", "-t", DOCKER_IMAGE, tmp], check=True)
    return DOCKER_IMAGE


def runtime_for(kind: str) -> dict[str, Any]:
    if kind == "bwrap":
        from polar_mq.runtimes.bwrap import bwrap_available

        reason = bwrap_available()
        if reason is not None:
            pytest.skip(f"bwrap runtime unavailable: {reason}")
        return {"kind": "bwrap"}
    if kind == "docker":
        return {"kind": "docker", "image": _docker_image(), "network": "none"}
    return {}


def task(cheat: str, repo: Path) -> dict[str, Any]:
    return {
        "instruction": "Make mul multiply.",
        "cheat": cheat,
        "script": AGENT.read_text(),
        "repo": {"path": str(repo)},
        "tests": {"files": {"tests/test_calc.py": HIDDEN}, "names": NAMES},
    }


def diff_artifacts(factory: sessionmaker[Session], ids: list[str]) -> dict[str, str]:
    with factory() as session:
        rows = session.scalars(
            select(RolloutArtifact).where(
                RolloutArtifact.rollout_id.in_([uuid.UUID(i) for i in ids]),
                RolloutArtifact.name == DIFF,
            )
        ).all()
    return {str(r.rollout_id): bytes(r.content).decode(errors="replace") for r in rows}


@pytest.mark.parametrize("kind", ["local", "bwrap", "docker"])
def test_every_cheat_scores_as_untouched_and_honest_work_scores_one(
    kind: str, rel: RelStack, sessions: sessionmaker[Session], repo: Path
) -> None:
    runtime = runtime_for(kind)
    cheats = ["untouched", *HONEST, *CHEATS]
    job = rel.client.submit(
        [task(cheat, repo) for cheat in cheats],
        samples_per_task=1,
        harness={"type": "command", "command": COMMAND},
        runtime=runtime,
        evaluator={"name": "tests", "score": "fraction"},
        timeouts={"agent_s": 120, "evaluate_s": 180},
    )
    ids = [str(r) for r in job.rollout_ids]
    wait_terminal(sessions, ids, 600)
    rollouts = check_invariants(rel, sessions, ids, dict.fromkeys(ids, "completed"))
    with sessions() as session:
        verdicts = {
            str(e.rollout_id): e.detail
            for e in session.scalars(
                select(Evaluation).where(Evaluation.rollout_id.in_([uuid.UUID(i) for i in ids]))
            )
        }
    by_cheat = {rollouts[rid].task_index: rid for rid in ids}
    rewards = {cheats[index]: rollouts[rid].reward for index, rid in by_cheat.items()}
    expected = {c: 1.0 if c in HONEST else 0.5 for c in cheats}
    assert rewards == expected, {cheats[i]: verdicts[rid] for i, rid in by_cheat.items()}
    diffs = diff_artifacts(sessions, ids)
    for index, rid in by_cheat.items():
        cheat, detail = cheats[index], verdicts[rid]
        assert detail["mode"] == "diff", detail
        dropped = {d["path"] for d in detail["dropped"]}
        if cheat in FLAGGED:
            assert FLAGGED[cheat] in dropped and FLAGGED[cheat] in detail["tampering"], detail
        else:
            assert "tampering" not in detail, (cheat, detail)
        # polar_mq's own files are in neither the stored diff nor the detail's file list
        assert not any(f.startswith(".polar/") or f == "answer.txt" for f in detail["diff_files"])
        stored = diffs.get(rid, "")
        assert ".polar/" not in stored and "answer.txt" not in stored and "task.json" not in stored
        if cheat in ("honest", "honest_commit"):
            assert "calc/__init__.py" in detail["diff_files"] and "+    return a * b" in stored
        if cheat == "git_base":  # the commit and the moved ref hide nothing
            assert "b/conftest.py" in stored, stored
