"""Real polar_mq groups for the bridge tests, and the trainers' environment that checks them.

The groups come from the real pipeline: a fake vLLM-shaped engine (byte-level tokenizer, the
scripted calculator policy: a tool call, its result, then the answer) behind the real proxy, the
four real stage workers and the API, read back through the group lease with trajectories and
GRPO advantages. So the token arrays, masks and logprobs the bridges convert are exactly what a
trainer gets, never hand-written ones that could drift from the stored format.

The trainers (trl, verl; slime is not on PyPI) are installed by scripts/setup_bridges.sh into
the vLLM venv, which has torch; the checks run there as subprocesses (`run_check`), with the
project on PYTHONPATH, and skip when it is not set up.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from polar_mq.client import Client
from polar_mq.inference import local_vllm
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, fake_upstream_stack

ROOT = Path(__file__).resolve().parents[2]
CHECKS = Path(__file__).with_name("checks")

TASKS = [
    {"instruction": "What is 6*7?", "answer": "42"},
    {"instruction": "Compute 12+30.", "answer": "42"},
    {"instruction": "What is 100-1?", "answer": "98"},  # the policy answers 99: reward 0
]
SAMPLES = 2
JOB: dict[str, Any] = {
    "harness": {"type": "reference"},
    "evaluator": "exact_match",
    "timeouts": {"agent_s": 60},
}


@dataclass(frozen=True)
class RealGroups:
    stack: LocalStack
    url: str
    merged: Path
    """prefix_merge groups (one sample per rollout, tool output under mask 0) as JSON."""
    per_call: Path
    """per_call groups (one sample per LLM call: several per rollout) as JSON."""

    def load(self, which: str = "merged") -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = json.loads(getattr(self, which).read_text())
        return groups


def stream_all(client: Client, builder: str) -> list[dict[str, Any]]:
    job = client.submit(TASKS, samples_per_task=SAMPLES, builder=builder, **JOB)
    batches = client.stream_groups(
        job.job_id, batch_size=len(TASKS), consumer="bridge-test", lease_s=300,
        include_trajectories=True, advantages="grpo",
    )  # fmt: skip
    groups = [g for batch in batches for g in batch]
    return sorted(groups, key=lambda g: g["task_index"])


@pytest.fixture(scope="module")
def real_groups(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealGroups]:
    tmp = tmp_path_factory.mktemp("bridges")
    with fake_upstream_stack(pg_url, tmp) as stack, client_of(stack) as client:
        merged, per_call = tmp / "merged.json", tmp / "per_call.json"
        merged.write_text(json.dumps(stream_all(client, "prefix_merge")))
        per_call.write_text(json.dumps(stream_all(client, "per_call")))
        s = stack.settings
        yield RealGroups(stack, f"http://{s.api_host}:{s.api_port}", merged, per_call)


def trainer_python() -> str:
    return str(local_vllm.vllm_python())


def bridges_installed() -> bool:
    """scripts/setup_bridges.sh ran (a marker, not an import: collection stays cheap)."""
    marker = local_vllm.cache_root() / "bridges.ready"
    return marker.is_file() and Path(trainer_python()).is_file()


def run_check(script: str, *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run `checks/<script>` in the trainers' venv; its last stdout line is a JSON report."""
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1",
    }  # fmt: skip
    done = subprocess.run(
        [trainer_python(), str(CHECKS / script), *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report
