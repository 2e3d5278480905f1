"""Software-engineering tasks end to end: the examples/swe repositories through the real pipeline.

Real API, Celery worker processes, proxy and fake upstream; the agent is a `command` harness (no
model needed) that applies a patch carried by its task (`git apply`, or writing the fixed files
where the image has no git) and probes what it can see. Rewards come from the `tests` evaluator
running the hidden tests: the reference fix scores 1.0, the untouched repository 0.0, a partial
fix the fraction of named tests it makes pass. The probe's findings are a file the agent leaves in
its workspace, so they come back in the evaluated diff: the agent must never see a hidden test in
its workspace or task file, and under bwrap and docker not even at its node path.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import Evaluation, Rollout
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of

pytestmark = pytest.mark.e2e

SWE = Path(__file__).resolve().parents[2] / "examples" / "swe"
NAMES = {
    task["metadata"]["repo"]: task["tests"]["names"]
    for task in json.loads((SWE / "job_mini_swe_agent.json").read_text())["tasks"]
}
PARTIAL = {"pagination": 2 / 3, "textstats": 3 / 4, "intervals": 1 / 3, "cart": 2 / 3}
DOCKER_IMAGE = "polar-mq-runtime:test"

# The agent: note any hidden test it can find, then apply its task's patch.
AGENT = r"""
probe() { echo "$1" >> probe.txt; }
: > probe.txt
if grep -rqs --exclude-dir=.git "def test_" .; then probe LEAK-WORKSPACE; fi
if {python} -c "import json, sys; sys.exit('tests' not in json.load(open('task.json')))" \
  || grep -qs "def test_" task.json; then probe LEAK-TASKFILE; fi
host=$({python} -c "import json; print(json.load(open('task.json'))['metadata']['hidden'])")
if cat "$host"/test_*.py > /dev/null 2>&1; then probe HOST-READABLE; fi
if command -v git > /dev/null; then
  fix="$TMPDIR/fix.patch"  # its own tmp: the runtime directory is not writable by the agent
  {python} -c "import json; print(json.load(open('task.json'))['patch'], end='')" > "$fix"
  if [ -s "$fix" ]; then git apply "$fix"; fi
else
  {python} -c "
import json
for path, text in json.load(open('task.json'))['fixed'].items():
    open(path, 'w').write(text)
"
fi
"""


def fixed_files(name: str, patch: str) -> dict[str, str]:
    """The files a patch changes, as they are after it (for images without git)."""
    if not patch:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / name
        shutil.copytree(SWE / "repos" / name, work)
        subprocess.run(["git", "apply", "-"], cwd=work, input=patch.encode(), check=True)
        changed = subprocess.run(
            ["git", "apply", "--numstat", "-"], input=patch.encode(), capture_output=True,
            check=True, cwd=work,
        ).stdout.decode()  # fmt: skip
        paths = [line.split("\t")[2] for line in changed.splitlines()]
        return {path: (work / path).read_text() for path in paths}


def swe_task(name: str, variant: str, expected: float) -> dict[str, Any]:
    patch_file = {"fix": f"{name}.patch", "partial": f"{name}.partial.patch"}.get(variant)
    patch = (SWE / "fixes" / patch_file).read_text() if patch_file else ""
    hidden = SWE / "hidden_tests" / name
    return {
        "instruction": f"Fix the bug in {name}.",
        "repo": {"path": str(SWE / "repos" / name)},
        "tests": {"path": str(hidden), "names": NAMES[name]},
        "patch": patch,
        "fixed": fixed_files(name, patch),
        "metadata": {"repo": name, "variant": variant, "expected": expected, "hidden": str(hidden)},
    }


def run_job(
    stack: LocalStack,
    sessions: sessionmaker[Session],
    tasks: list[dict[str, Any]],
    runtime: dict[str, Any],
) -> list[tuple[dict[str, Any], Rollout, Evaluation]]:
    client = client_of(stack)
    job = client.submit(
        tasks,
        samples_per_task=1,
        harness={"type": "command", "command": AGENT},
        runtime=runtime,
        evaluator={"name": "tests", "score": "fraction"},
        timeouts={"agent_s": 120, "evaluate_s": 120},
    )
    status = client.wait(str(job.job_id), progress=False, timeout=600)
    assert status["by_status"] == {"completed": len(tasks)}, status
    with sessions() as session:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        found = []
        for rollout in sorted(rollouts, key=lambda r: r.task_index):
            evaluation = session.scalars(
                select(Evaluation).where(Evaluation.rollout_id == rollout.id)
            ).one()
            found.append((tasks[rollout.task_index], rollout, evaluation))
    return found


def probe_findings(evaluation: Evaluation) -> set[str]:
    """What the agent's probe wrote (it is a new file, so it is in the evaluated diff)."""
    diff = evaluation.detail["diff"]
    assert "probe.txt" in evaluation.detail["diff_files"], evaluation.detail
    section = diff.split("b/probe.txt", 1)[1].split("diff --git", 1)[0]
    return {line[1:] for line in section.splitlines() if line.startswith("+") and "+++" not in line}


def test_reference_untouched_and_partial_fixes_score_as_expected_locally(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    tasks = [swe_task(name, "fix", 1.0) for name in NAMES]
    tasks += [swe_task(name, "none", 0.0) for name in NAMES]
    tasks += [swe_task(name, "partial", fraction) for name, fraction in PARTIAL.items()]
    for task, rollout, evaluation in run_job(fake_stack, db_session_factory, tasks, {}):
        meta = task["metadata"]
        assert rollout.reward == pytest.approx(meta["expected"]), (meta, evaluation.detail)
        detail = evaluation.detail
        assert detail["counts"]["passed"] + detail["counts"]["failed"] == len(NAMES[meta["repo"]])
        # local is no sandbox: the node path is readable (which shows the probe works), but
        # nothing hidden is in the workspace or the task file
        assert probe_findings(evaluation) == {"HOST-READABLE"}
        if meta["variant"] == "none":
            assert detail["diff_files"] == ["probe.txt"]
        else:
            assert f"{meta['repo']}/__init__.py" in detail["diff_files"]
            assert not any(f.startswith("tests/") for f in detail["diff_files"])


def test_a_bad_repository_fails_prepare_with_a_reason(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    client = client_of(fake_stack)
    job = client.submit(
        [{"instruction": "x", "repo": {"path": str(tmp_path / "missing")}}],
        samples_per_task=1,
        harness={"type": "command", "command": "true"},
        retries={"max_attempts": 1},
    )
    status = client.wait(str(job.job_id), progress=False, timeout=120)
    with db_session_factory() as session:
        (rollout,) = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
    assert rollout.termination_reason == "runtime_error", status
    assert "is not a directory on this node" in (rollout.error or "")


def test_bwrap_with_a_separate_grading_runtime(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    from polar_mq.runtimes.bwrap import bwrap_available

    reason = bwrap_available()
    if reason is not None:
        pytest.skip(f"bwrap runtime unavailable: {reason}")
    tasks = [swe_task("pagination", "fix", 1.0), swe_task("intervals", "partial", 1 / 3)]
    runtime = {"kind": "bwrap", "evaluation": {"prepare": {}}}
    for task, rollout, evaluation in run_job(fake_stack, db_session_factory, tasks, runtime):
        assert rollout.reward == pytest.approx(task["metadata"]["expected"]), evaluation.detail
        assert probe_findings(evaluation) == set(), "nothing hidden is visible inside bwrap"


def _docker_skip_reason() -> str | None:
    from polar_mq.runtimes.docker import default_client, docker_available

    reason = docker_available()
    if reason is None and not default_client().images.list(name=DOCKER_IMAGE):
        reason = f"image {DOCKER_IMAGE} missing: run scripts/build_test_image.sh"
    return reason


RUNNER = """import importlib, pathlib, sys
sys.path[:0] = ["tests", "."]
module = importlib.import_module("test_intervals")
names = sys.argv[1:]
passed = 0
for name in names:
    try:
        getattr(module, name)()
        passed += 1
    except Exception:
        pass
pathlib.Path("reward.txt").write_text(str(passed / len(names)))
"""


def test_docker_hides_the_tests_and_grades_by_reward_file(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    reason = _docker_skip_reason()
    if reason is not None:
        pytest.skip(f"docker runtime unavailable: {reason}")
    hidden = tmp_path / "hidden_intervals"  # the image has no pytest: a stdlib runner
    shutil.copytree(SWE / "hidden_tests" / "intervals", hidden)
    (hidden / "run.py").write_text(RUNNER)
    names = " ".join(n.split("::")[1] for n in NAMES["intervals"])
    tasks = []
    for variant, expected in (("fix", 1.0), ("none", 0.0), ("partial", 1 / 3)):
        task = swe_task("intervals", variant, expected)
        task["tests"] = {
            "path": str(hidden),
            "command": f"{{python}} tests/run.py {names}",
            "reward_file": "reward.txt",
        }
        task["metadata"]["hidden"] = str(hidden)
        tasks.append(task)
    runtime = {"kind": "docker", "image": DOCKER_IMAGE, "network": "none"}
    for task, rollout, evaluation in run_job(fake_stack, db_session_factory, tasks, runtime):
        assert rollout.reward == pytest.approx(task["metadata"]["expected"]), evaluation.detail
        assert probe_findings(evaluation) == set(), "nothing hidden is visible in the container"
