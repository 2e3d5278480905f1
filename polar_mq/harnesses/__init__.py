"""Harnesses: how an unmodified agent program is started inside a runtime.

`get_harness` turns a job's typed harness spec (`polar_mq.spec.HarnessSpec`) into a `Harness`;
the API calls it at submission time so that a bad spec is a 4xx, never a failed rollout.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from polar_mq.harnesses.auxiliary import AuxiliaryRule, parse_rules
from polar_mq.harnesses.base import (
    DEFAULT_ANSWER,
    PROXY_ENV_VARS,
    AgentContext,
    AnswerSource,
    Harness,
    proxy_env,
)
from polar_mq.harnesses.command import PLACEHOLDERS, CommandHarness
from polar_mq.harnesses.presets.harness import PresetHarness
from polar_mq.harnesses.presets.registry import get_preset, presets
from polar_mq.spec.model import HarnessSpec, harness_fields_problem

REFERENCE_AGENT_MODULE = "polar_mq.agents.tool_agent"


REFERENCE_TEMPLATE = f"{{python}} -m {REFERENCE_AGENT_MODULE}"
"""Started with the runtime's interpreter (`AgentContext.python`), which must have polar_mq's
agent and the openai SDK: the worker's own for `local`/`bwrap`, the image's for `docker` (see
scripts/build_agent_image.sh for an image that has both)."""


def reference_command(python: str = sys.executable) -> str:
    """The built-in tool agent's command line for the interpreter `python`."""
    return f"{shlex.quote(python)} -m {REFERENCE_AGENT_MODULE}"


def _rules(spec: HarnessSpec) -> tuple[AuxiliaryRule, ...]:
    try:
        return parse_rules(spec.auxiliary_calls)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"bad 'auxiliary_calls': {first.get('msg')}") from exc


def _command(spec: HarnessSpec) -> Harness:
    return CommandHarness(spec.command or "", spec.env, _rules(spec), spec.artifacts)


def _reference(spec: HarnessSpec) -> Harness:
    return CommandHarness(REFERENCE_TEMPLATE, spec.env)


HARNESS_TYPES: dict[str, Callable[[HarnessSpec], Harness]] = {
    "command": _command,
    "reference": _reference,
}
"""The built-in types; the fields each takes are `polar_mq.spec.model.HARNESS_FIELDS`."""


def get_harness(spec: HarnessSpec | Mapping[str, Any]) -> Harness:
    """The harness of a job's typed spec (a mapping, as a library caller writes one, is parsed
    first: `parse_harness_spec`)."""
    if not isinstance(spec, HarnessSpec):
        spec = parse_harness_spec(spec)
    factory = HARNESS_TYPES.get(spec.type)
    if factory is not None:
        return factory(spec)
    preset = get_preset(spec.type)
    if preset is None:
        known = ", ".join([*sorted(HARNESS_TYPES), *presets()])
        raise ValueError(f"unknown harness type {spec.type!r}; known types: {known}")
    return PresetHarness(preset, spec)


def parse_harness_spec(raw: Mapping[str, Any]) -> HarnessSpec:
    """A harness spec written as a mapping (`{"type": "command", "command": ...}`), typed; a
    ValueError names the bad field. An empty mapping is the reference agent, as in a job."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"harness spec must be a mapping, got {type(raw).__name__}")
    kind = raw.get("type", "reference")
    if isinstance(kind, str):  # the type's own message before pydantic's "extra field"
        problem = harness_fields_problem(kind, set(raw))
        if problem is not None:
            raise ValueError(problem)
    try:
        return HarnessSpec.model_validate(dict(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(
            f"bad harness spec: {where}: {first['msg']}"
            if where
            else f"bad harness spec: {first['msg']}"
        ) from exc


__all__ = [
    "DEFAULT_ANSWER",
    "HARNESS_TYPES",
    "PLACEHOLDERS",
    "PROXY_ENV_VARS",
    "REFERENCE_AGENT_MODULE",
    "AgentContext",
    "AnswerSource",
    "AuxiliaryRule",
    "CommandHarness",
    "Harness",
    "PresetHarness",
    "get_harness",
    "parse_harness_spec",
    "proxy_env",
    "reference_command",
]
