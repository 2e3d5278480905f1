"""A job's sampling policy: which of its sampling values the proxy enforces on the agent's calls.

Third-party harnesses pick their own sampling (aider sends temperature 0, so every sample of a
group is the same; Claude Code asks for 32,000 tokens, more than a small model's context), so the
job's `sampling` is the proxy's to enforce. `sampling.enforce` is one mode for every field or a
mapping field -> mode:

- `override`: the job's value replaces the agent's (or is added when the agent sent none);
- `clamp`: the smaller of the agent's value and the job's (the job's when the agent sent none);
- `off`: the agent's value is left alone.

Defaults: `override` for `temperature` and `top_p`, `clamp` for `max_tokens`, `off` for `top_k`.
A field the job's sampling does not set is never enforced.

`sampling.exact: true` (a training job's: `polar_mq.training.loop`) also removes from every call
the request fields that would make the engine sample from, and report the logprobs of, anything
but `softmax(logits / temperature)` (`SHAPING_FIELDS`: penalties, `min_p`, `logit_bias`, guided
decoding, beam search...), and turns a forced `tool_choice` (which vLLM decodes under a JSON
schema) back to `auto`: the learner scores the plain tempered distribution, so any of these would
make its importance ratios compare two different policies. The effective policy travels in the
agent's signed rollout token (`polar_mq.capability.tokens`), so the proxy enforces it without a
lookup.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

OVERRIDE: Final = "override"
CLAMP: Final = "clamp"
OFF: Final = "off"
MODES = (OVERRIDE, CLAMP, OFF)

FIELDS = ("temperature", "top_p", "top_k", "max_tokens")
"""The enforceable fields, in the order a policy lists them."""
INTEGER_FIELDS = frozenset({"top_k", "max_tokens"})
PASSED_FIELDS = frozenset(
    {
        "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "seed",
        "stop", "stop_token_ids", "bad_words", "ignore_eos", "min_tokens", "logprobs",
        "top_logprobs", "prompt_logprobs", "logit_bias", "allowed_token_ids",
        "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
        "truncate_prompt_tokens", "max_completion_tokens",
    }
)  # fmt: skip
"""Sampling keys of OpenAI's API and vLLM's `SamplingParams` the proxy does not enforce:
accepted and stored with the job (a harness may read them), never checked or applied."""
SHAPING_FIELDS = frozenset(
    {
        "min_p", "logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty",
        "min_tokens", "bad_words", "allowed_token_ids", "logits_processors", "vllm_xargs",
        "best_of", "use_beam_search", "length_penalty", "response_format", "structured_outputs",
        "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "guided_decoding_backend", "guided_whitespace_pattern", "regex", "ebnf", "json_schema",
        "extra_body",
    }
)  # fmt: skip
"""Request fields (OpenAI's, vLLM's and SGLang's) that change which distribution the engine
samples from and reports logprobs of, beyond temperature, top_p and top_k: `exact` removes them.
`extra_body` is the OpenAI SDK's argument, sent as a literal key only by a raw HTTP agent: vLLM
ignores it, but a server that unpacks it would apply the fields it hides, so it goes too."""
EXACT: Final = "exact"
KNOWN_KEYS = frozenset({*FIELDS, "enforce", EXACT, *PASSED_FIELDS})
"""Every key a job's `sampling` may hold; any other is a typo (`temprature`), refused at submit
rather than silently ignored."""
DEFAULT_ENFORCE: Final[Mapping[str, str]] = {
    "temperature": OVERRIDE,
    "top_p": OVERRIDE,
    "top_k": OFF,
    "max_tokens": CLAMP,
}


@dataclass(frozen=True, slots=True)
class SamplingRule:
    """One enforced field: the job's `value` applied with `mode` (`override` or `clamp`)."""

    field: str
    mode: str
    value: int | float

    def apply(self, asked: Any) -> int | float:
        """The value the engine gets when the agent asked for `asked` (None: nothing)."""
        if self.mode == OVERRIDE or not is_number(asked):
            return self.value
        number: int | float = asked  # a number: checked by is_number above
        if _limit(self.field, number) <= _limit(self.field, self.value):
            return number
        return self.value


@dataclass(frozen=True, slots=True)
class SamplingPolicy:
    """The enforced fields of a job (empty: nothing is enforced); hashable, so claims cache it."""

    rules: tuple[SamplingRule, ...] = ()
    exact: bool = False
    """Remove the `SHAPING_FIELDS` and a forced `tool_choice` from every call."""

    def __bool__(self) -> bool:
        return bool(self.rules) or self.exact

    def __iter__(self) -> Iterator[SamplingRule]:
        return iter(self.rules)

    def get(self, field: str) -> SamplingRule | None:
        return next((rule for rule in self.rules if rule.field == field), None)

    def as_dict(self) -> dict[str, Any]:
        """`{field: [mode, value]}` (and `exact: True`), e.g. for logs and tests."""
        out: dict[str, Any] = {rule.field: [rule.mode, rule.value] for rule in self.rules}
        if self.exact:
            out[EXACT] = True
        return out


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _limit(field: str, value: int | float) -> float:
    """`value` as a bound to compare: a `top_k` below 1 means no limit (vLLM's -1 and 0)."""
    if field == "top_k" and value < 1:
        return math.inf
    return float(value)


def enforce_modes(enforce: Any) -> dict[str, str]:
    """Every enforceable field's mode for a job's `sampling.enforce` (None: the defaults).

    Raises `ValueError` with a readable message for an unknown mode or field.
    """
    if enforce is None:
        return dict(DEFAULT_ENFORCE)
    if isinstance(enforce, str):
        _check_mode(enforce, "enforce")
        return dict.fromkeys(FIELDS, enforce)
    if not isinstance(enforce, Mapping):
        raise ValueError(
            f"enforce: expected one of {', '.join(MODES)} or a mapping field -> mode, "
            f"got {type(enforce).__name__}"
        )
    modes = dict(DEFAULT_ENFORCE)
    for field, mode in enforce.items():
        if field not in DEFAULT_ENFORCE:
            raise ValueError(f"enforce: unknown field {field!r}; enforceable: {', '.join(FIELDS)}")
        _check_mode(mode, f"enforce.{field}")
        modes[field] = mode
    return modes


def _check_mode(mode: Any, where: str) -> None:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"{where}: unknown mode {mode!r}; expected one of {', '.join(MODES)}")


def value_problem(field: str, value: Any) -> str | None:
    """Why `value` cannot be enforced as `field` (None: it can)."""
    if field in INTEGER_FIELDS:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{field}: expected an integer to enforce, got {value!r}"
    elif not is_number(value):
        return f"{field}: expected a number to enforce, got {value!r}"
    if field == "temperature" and value < 0:
        return f"temperature: must be >= 0, got {value!r}"
    if field == "top_p" and not 0 < value <= 1:
        return f"top_p: must be in (0, 1], got {value!r}"
    if field == "top_k" and value < -1:
        return f"top_k: must be >= -1 (-1: no limit), got {value!r}"
    if field == "max_tokens" and value < 1:
        return f"max_tokens: must be >= 1, got {value!r}"
    return None


def unknown_key_problem(sampling: Mapping[str, Any]) -> str | None:
    """Why `sampling` holds a key no engine or harness reads (naming the closest known one)."""
    for key in sampling:
        if key in KNOWN_KEYS:
            continue
        close = difflib.get_close_matches(str(key), sorted(KNOWN_KEYS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            f"unknown key {key!r}{hint}; enforced by the proxy: {', '.join(FIELDS)} "
            f"(with enforce); also accepted: {', '.join(sorted(PASSED_FIELDS))}"
        )
    return None


def validate_sampling(sampling: Mapping[str, Any]) -> None:
    """Refuse (`ValueError`) a job's sampling with an unknown key, or whose `enforce` or enforced
    values are unusable."""
    problem = unknown_key_problem(sampling)
    if problem is not None:
        raise ValueError(problem)
    if not isinstance(sampling.get(EXACT, False), bool):
        raise ValueError(f"exact: expected true or false, got {sampling[EXACT]!r}")
    modes = enforce_modes(sampling.get("enforce"))
    for field in FIELDS:
        value = sampling.get(field)
        if value is None or modes[field] == OFF:
            continue
        problem = value_problem(field, value)
        if problem is not None:
            raise ValueError(problem)


def sampling_policy(sampling: Mapping[str, Any] | None) -> SamplingPolicy:
    """The policy a job's (stored) sampling asks for.

    Lenient, unlike `validate_sampling`: a spec stored before validation existed never fails a
    rollout; an unusable `enforce` enforces nothing and an unusable value is not enforced.
    """
    if not sampling:
        return SamplingPolicy()
    exact = sampling.get(EXACT) is True
    try:
        modes = enforce_modes(sampling.get("enforce"))
    except ValueError:
        return SamplingPolicy(exact=exact)
    rules = []
    for field in FIELDS:
        value = sampling.get(field)
        mode = modes[field]
        if mode == OFF or value is None or value_problem(field, value) is not None:
            continue
        rules.append(SamplingRule(field, mode, value))
    return SamplingPolicy(tuple(rules), exact)
