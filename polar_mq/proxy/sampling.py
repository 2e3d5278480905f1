"""The job's sampling policy applied to a call, before the engine layer rewrites it.

The policy comes from the rollout token (`polar_mq.capability.sampling`,
`polar_mq.capability.tokens`), so enforcing it costs no lookup. It is applied to the chat or
completions request the engine will get (for the other API families: the chat request they were
translated to). `max_tokens` also governs `max_completion_tokens` when the agent uses that field;
when the agent sent neither, the job's value is added as `max_tokens`. An `exact` policy also
removes the fields that shape the engine's distribution and un-forces `tool_choice`
(`capability.sampling.SHAPING_FIELDS`); each shows in the changes as `[asked, None]` (removed) or
`[asked, "auto"]`.
"""

from __future__ import annotations

from typing import Any

from polar_mq.capability.sampling import SHAPING_FIELDS, SamplingPolicy, is_number

TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
PLAIN_TEXT = {"type": "text"}
"""The one `response_format` that constrains nothing."""
FREE_TOOL_CHOICES = (None, "auto", "none")
"""`tool_choice` values that leave the model's tokens unconstrained; `required` or a named
function has vLLM decode the call under a JSON schema."""


def enforce(
    policy: SamplingPolicy | None, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """`(the enforced shallow copy of body, {field: [asked, used]})`, or None if nothing changed.

    `asked` is None when the agent did not send the field. `body` itself is never modified.
    """
    if not policy:
        return None
    changes: dict[str, Any] = {}
    for rule in policy:
        if rule.field == "max_tokens":
            keys = [key for key in TOKEN_FIELDS if body.get(key) is not None] or ["max_tokens"]
        else:
            keys = [rule.field]
        for key in keys:
            asked = body.get(key)
            used = rule.apply(asked)
            if not is_number(asked) or used != asked:  # 1 and 1.0 are the same to the engine
                changes[key] = [asked, used]
    if policy.exact:
        changes.update(_unshaped(body))
    if not changes:
        return None
    out = dict(body)
    for key, (_, used) in changes.items():
        if used is None:
            del out[key]
        else:
            out[key] = used
    return out, changes


def _unshaped(body: dict[str, Any]) -> dict[str, list[Any]]:
    """What an `exact` policy changes in `body`: `{field: [asked, None (removed) or "auto"]}`."""
    changes: dict[str, list[Any]] = {
        key: [body[key], None]
        for key in SHAPING_FIELDS.intersection(body)
        if body[key] is not None and not (key == "response_format" and body[key] == PLAIN_TEXT)
    }
    choice = body.get("tool_choice")
    if choice not in FREE_TOOL_CHOICES:
        changes["tool_choice"] = [choice, "auto"]
    return changes
