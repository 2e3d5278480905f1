"""The runtime network a job is stored with: `proxy_only` by default for untrusted presets.

Resolved at submit (`JobCreate.job_spec`), so the stages and the API read the effective value.
"""

from __future__ import annotations

from typing import Any

import pytest

from polar_mq.harnesses.presets.registry import harness_trusted, presets
from polar_mq.jobs.schemas import JobCreate
from polar_mq.runtimes.options import effective_network


def stored_network(harness: dict[str, Any], runtime: dict[str, Any]) -> str:
    spec = JobCreate(tasks=[{"instruction": "x"}], harness=harness, runtime=runtime)
    network: str = spec.stored_spec("default")["runtime"]["network"]
    return network


@pytest.mark.parametrize("kind", ["bwrap", "docker"])
def test_an_untrusted_preset_in_a_sandbox_defaults_to_proxy_only(kind: str) -> None:
    runtime = {"kind": kind, "image": "img:1"} if kind == "docker" else {"kind": kind}
    assert stored_network({"type": "smolagents"}, runtime) == "proxy_only"
    assert stored_network({"type": "claude_code"}, runtime) == "proxy_only"


@pytest.mark.parametrize("network", ["host", "none", "proxy_only"])
def test_an_explicit_network_is_kept(network: str) -> None:
    assert stored_network({"type": "smolagents"}, {"kind": "bwrap", "network": network}) == network


def test_trusted_harnesses_and_local_keep_the_node_network() -> None:
    command = {"type": "command", "command": "true"}
    assert stored_network(command, {"kind": "bwrap"}) == "host"
    assert stored_network({"type": "reference"}, {"kind": "bwrap"}) == "host"
    assert stored_network({}, {"kind": "bwrap"}) == "host"
    # local cannot enforce a policy: a preset there runs on the node's network, as before
    assert stored_network({"type": "smolagents"}, {"kind": "local"}) == "host"
    assert stored_network({"type": "smolagents"}, {}) == "host"


def test_the_rest_of_the_spec_is_untouched() -> None:
    spec = JobCreate(
        tasks=[{"instruction": "x"}],
        harness={"type": "aider"},
        runtime={"kind": "bwrap", "pids": 64, "prepare": {"commands": ["true"]}},
    )
    stored = spec.stored_spec("gpu")
    plain = {**spec.stored_spec(), "pool": "gpu"}
    assert stored["runtime"] == {**plain["runtime"], "network": "proxy_only"}
    assert {k: v for k, v in stored.items() if k != "runtime"} == {
        k: v for k, v in plain.items() if k != "runtime"
    }


def test_every_preset_declares_whether_it_is_trusted() -> None:
    assert presets(), "no presets found"
    for name, preset in presets().items():
        assert isinstance(preset.trusted, bool), name
        assert harness_trusted(name) is preset.trusted
    assert harness_trusted("command") and harness_trusted("reference")


@pytest.mark.parametrize(
    ("kind", "network", "trusted", "expected"),
    [
        ("bwrap", None, False, "proxy_only"),
        ("docker", None, False, "proxy_only"),
        ("local", None, False, "host"),
        ("bwrap", None, True, "host"),
        ("bwrap", "host", False, "host"),
        ("docker", "none", False, "none"),
    ],
)
def test_effective_network_rule(
    kind: str, network: str | None, trusted: bool, expected: str
) -> None:
    assert effective_network(kind, network, trusted=trusted) == expected
