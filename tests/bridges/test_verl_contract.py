"""The verl bridge against verl 0.9.1's real classes, on groups of a real polar_mq run.

Runs in the trainers' venv (scripts/setup_bridges.sh): `AgentLoopOutput`s and the `DataProto`
batch, checked with verl's own code (see tests/bridges/checks/check_verl.py). verl's trainer
(Ray workers, FSDP/Megatron, a GPU rollout engine) is not run here.
"""

from __future__ import annotations

import pytest

from tests.bridges.conftest import SAMPLES, TASKS, RealGroups, bridges_installed, run_check

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        not bridges_installed(),
        reason="verl not in the trainers' venv: bash scripts/setup_bridges.sh",
    ),
]


def test_agent_loop_outputs_and_data_proto_of_merged_groups(real_groups: RealGroups) -> None:
    report = run_check("check_verl.py", str(real_groups.merged))
    assert report["rows"] == len(TASKS) * SAMPLES and report["groups"] == len(TASKS)
    assert report["trained_tokens"] > 0


def test_per_call_groups_give_one_row_per_call(real_groups: RealGroups) -> None:
    report = run_check("check_verl.py", str(real_groups.per_call))
    assert report["rows"] > len(TASKS) * SAMPLES
