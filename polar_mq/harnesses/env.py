"""The user's `env` of a harness spec: str to str, and never the variables polar_mq reserves."""

from __future__ import annotations

from typing import Any

from polar_mq.harnesses.base import PROXY_ENV_VARS


def check_user_env(env: Any) -> dict[str, str]:
    """A copy of `env`, refused (ValueError) when it is not str->str or sets a proxy variable.

    Refused at construction, before any rollout runs, rather than silently bypassing capture.
    """
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ValueError("harness 'env' must be a mapping of str to str")
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"harness env must map str to str, got {key!r}: {value!r}")
    reserved = sorted(PROXY_ENV_VARS & env.keys())
    if reserved:
        raise ValueError(f"harness env may not set {', '.join(reserved)} (set by polar_mq)")
    return dict(env)
