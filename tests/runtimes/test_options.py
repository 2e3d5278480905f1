"""Job spec `runtime` → runtime handle: kinds, their options, and refusals at submit time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from polar_mq.jobs.schemas import JobCreate
from polar_mq.runtimes import LocalRuntime, ResourceLimits, runtime_from_spec
from polar_mq.runtimes.bwrap import BwrapRuntime
from polar_mq.runtimes.docker import DockerRuntime


def job(runtime: dict[str, Any]) -> JobCreate:
    return JobCreate(
        tasks=[{"instruction": "x"}],
        harness={"type": "command", "command": "true"},
        runtime=runtime,
    )


def test_each_kind_gets_its_options(tmp_path: Path) -> None:
    spec = job({"kind": "docker", "image": "img:1", "network": "none", "cpus": 1.5, "pids": 64})
    rt = runtime_from_spec(spec.job_spec().runtime, "rt-1", tmp_path)
    assert isinstance(rt, DockerRuntime)
    assert (rt.image, rt.network, rt.cpus, rt.pids_limit) == ("img:1", "none", 1.5, 64)

    spec = job({"kind": "docker", "image": "img:1", "network": "proxy_only"})
    rt = runtime_from_spec(spec.job_spec().runtime, "rt-4", tmp_path)
    assert isinstance(rt, DockerRuntime) and rt.network == "proxy_only"

    spec = job({"kind": "bwrap", "network": "none", "pids": 32, "memory_mb": 256})
    rt = runtime_from_spec(spec.job_spec().runtime, "rt-2", tmp_path)
    assert isinstance(rt, BwrapRuntime)
    assert (rt.network, rt.pids_limit, rt.limits) == ("none", 32, ResourceLimits(memory_mb=256))

    rt = runtime_from_spec(job({}).job_spec().runtime, "rt-3", tmp_path)
    assert type(rt) is LocalRuntime and rt.limits is None
    grader = {"prepare": {"files": {"t.sh": "true"}, "commands": []}}
    assert job({"evaluation": grader}).stored_spec()["runtime"]["evaluation"] == grader
    assert job({}).stored_spec()["runtime"].get("evaluation") is None


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ({"kind": "docker"}, "needs an image"),
        ({"kind": "local", "network": "none"}, "network='none' needs kind bwrap or docker"),
        ({"kind": "bwrap", "cpus": 2}, "cpus=2.0 needs kind docker"),
        ({"kind": "local", "image": "img:1"}, "image='img:1' needs kind docker"),
        ({"kind": "local", "pids": 64}, "pids=64 needs kind bwrap or docker"),
        ({"kind": "k8s"}, "Input should be 'local', 'bwrap' or 'docker'"),
        ({"kind": "docker", "image": "i", "network": "bridge"}, "Input should be 'host', 'none'"),
        (
            {"kind": "local", "network": "proxy_only"},
            "network='proxy_only' needs kind bwrap or docker",
        ),
        ({"kind": "docker", "image": "i", "pids": 2}, "greater than or equal to 8"),
        ({"evaluation": {"image": "other"}}, "Extra inputs are not permitted"),
        ({"evaluation": {"prepare": {"commands": "make test"}}}, "Input should be a valid list"),
    ],
)
def test_refused_at_submit(runtime: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        job(runtime)
