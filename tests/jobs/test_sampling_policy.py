"""`sampling.enforce`: validated at the door, the effective policy per job, and what it does to a
request (`polar_mq.proxy.sampling.enforce`)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from polar_mq.capability.sampling import SamplingPolicy, SamplingRule, sampling_policy
from polar_mq.jobs.schemas import JobCreate
from polar_mq.proxy.sampling import enforce

TASKS = [{"instruction": "do it"}]


def job(sampling: dict[str, Any]) -> JobCreate:
    return JobCreate(tasks=TASKS, sampling=sampling)


def policy(**rules: tuple[str, float]) -> SamplingPolicy:
    return SamplingPolicy(tuple(SamplingRule(f, mode, value) for f, (mode, value) in rules.items()))


def test_defaults_override_temperature_and_top_p_and_clamp_max_tokens() -> None:
    sampling = {"temperature": 0.7, "top_p": 0.95, "top_k": 20, "max_tokens": 512, "seed": 3}
    assert sampling_policy(sampling).as_dict() == {
        "temperature": ["override", 0.7],
        "top_p": ["override", 0.95],
        "max_tokens": ["clamp", 512],
    }  # top_k is off by default; seed is not enforceable
    assert sampling_policy({}) == SamplingPolicy() and not sampling_policy(None)


def test_one_mode_for_all_and_a_per_field_mapping() -> None:
    sampling = {"temperature": 0.7, "top_k": 20, "max_tokens": 512}
    assert sampling_policy({**sampling, "enforce": "off"}) == SamplingPolicy()
    assert sampling_policy({**sampling, "enforce": "clamp"}).as_dict() == {
        "temperature": ["clamp", 0.7],
        "top_k": ["clamp", 20],
        "max_tokens": ["clamp", 512],
    }
    mapping = {"temperature": "off", "max_tokens": "override", "top_k": "clamp", "top_p": "clamp"}
    assert sampling_policy({**sampling, "enforce": mapping}).as_dict() == {
        "top_k": ["clamp", 20],
        "max_tokens": ["override", 512],
    }  # top_p is enforced but the job sets none: ignored


def test_a_job_without_enforce_stores_the_same_spec_as_before() -> None:
    sampling = {"temperature": 0.7, "max_tokens": 64}
    spec = job(sampling).stored_spec()
    assert spec["sampling"] == sampling
    assert "enforce" not in spec["sampling"]
    assert JobCreate(tasks=TASKS).stored_spec()["sampling"] == {}
    enforced = job({**sampling, "enforce": {"max_tokens": "override"}}).stored_spec()
    assert enforced["sampling"]["enforce"] == {"max_tokens": "override"}


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"enforce": "always"}, "enforce: unknown mode 'always'"),
        ({"enforce": 3}, "enforce: expected one of override, clamp, off"),
        ({"enforce": {"seed": "override"}}, "enforce: unknown field 'seed'"),
        ({"enforce": {"temperature": "max"}}, "enforce.temperature: unknown mode 'max'"),
        ({"temperature": "hot"}, "temperature: expected a number to enforce"),
        ({"temperature": True}, "temperature: expected a number to enforce"),
        ({"max_tokens": 51.5}, "max_tokens: expected an integer to enforce"),
        ({"max_tokens": 0}, "max_tokens: must be >= 1"),
        ({"top_p": 1.5}, "top_p: must be in (0, 1]"),
        ({"top_k": "5", "enforce": "clamp"}, "top_k: expected an integer to enforce"),
        ({"exact": "yes"}, "exact: expected true or false"),
    ],
)
def test_bad_modes_fields_and_values_are_refused(sampling: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        job(sampling)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("temprature", "unknown key 'temprature' (did you mean 'temperature'?)"),
        ("max_token", "unknown key 'max_token' (did you mean 'max_tokens'?)"),
        ("topp", "unknown key 'topp' (did you mean 'top_p'?)"),
        ("colour", "unknown key 'colour'; enforced by the proxy: temperature, top_p"),
    ],
)
def test_an_unknown_key_is_refused_with_the_closest_known_one(key: str, message: str) -> None:
    """A typo used to be stored and ignored: the job ran at the harness's own temperature."""
    with pytest.raises(ValidationError) as caught:
        job({key: 0.7})
    assert message in str(caught.value)


def test_engine_sampling_keys_the_proxy_does_not_enforce_are_accepted() -> None:
    passed = {"seed": 1, "min_p": 0.05, "repetition_penalty": 1.1, "stop": ["\n"], "n": 1}
    assert job({**passed, "presence_penalty": 0.5}).stored_spec()["sampling"]["seed"] == 1


def test_values_that_are_not_enforced_are_not_checked() -> None:
    job({"top_k": "5"})  # top_k is off by default
    job({"temperature": "hot", "enforce": {"temperature": "off"}})
    job({"seed": "anything", "enforce": "override"})


def test_enforce_overrides_clamps_and_leaves_alone() -> None:
    rules = policy(temperature=("override", 0.9), max_tokens=("clamp", 64))
    asked = {"model": "m", "messages": [], "temperature": 0, "max_tokens": 32000}
    enforced = enforce(rules, asked)
    assert enforced is not None
    body, changes = enforced
    assert body == {**asked, "temperature": 0.9, "max_tokens": 64}
    assert changes == {"temperature": [0, 0.9], "max_tokens": [32000, 64]}
    assert asked["temperature"] == 0 and asked["max_tokens"] == 32000  # the agent's body is intact
    assert enforce(rules, {"temperature": 0.9, "max_tokens": 10}) is None  # within the clamp
    added = enforce(rules, {"messages": []})
    assert added is not None and added[0] == {"messages": [], "temperature": 0.9, "max_tokens": 64}
    assert enforce(SamplingPolicy(), asked) is None and enforce(None, asked) is None


def test_max_tokens_governs_max_completion_tokens_too() -> None:
    rules = policy(max_tokens=("clamp", 64))
    enforced = enforce(rules, {"max_completion_tokens": 32000})
    assert enforced is not None and enforced[0] == {"max_completion_tokens": 64}
    both = enforce(rules, {"max_completion_tokens": 32000, "max_tokens": 16})
    assert both is not None and both[0] == {"max_completion_tokens": 64, "max_tokens": 16}
    bad = enforce(rules, {"max_tokens": "lots"})
    assert bad is not None and bad[0] == {"max_tokens": 64}


def test_a_clamped_top_k_treats_no_limit_as_the_largest() -> None:
    rules = policy(top_k=("clamp", 20))
    assert enforce(rules, {"top_k": 5}) is None
    for unlimited in (-1, 0, 50):
        enforced = enforce(rules, {"top_k": unlimited})
        assert enforced is not None and enforced[0] == {"top_k": 20}
    no_limit = policy(top_k=("clamp", -1))
    assert enforce(no_limit, {"top_k": 5}) is None


def test_equal_numbers_are_not_a_change() -> None:
    rules = policy(temperature=("override", 1), max_tokens=("override", 64))
    assert enforce(rules, {"temperature": 1.0, "max_tokens": 64}) is None
    changed = enforce(rules, {"temperature": True, "max_tokens": 64})
    assert changed is not None and changed[1] == {"temperature": [True, 1]}


def test_exact_is_read_into_the_policy_even_without_enforced_values() -> None:
    assert sampling_policy({"exact": True}) == SamplingPolicy(exact=True)
    assert sampling_policy({"exact": True})  # a policy to sign into the token
    assert not sampling_policy({"exact": False}) and not sampling_policy({"exact": "yes"})
    assert sampling_policy({"exact": True, "enforce": "bogus"}).exact  # lenient on stored specs
    assert job({"exact": True}).stored_spec()["sampling"] == {"exact": True}
