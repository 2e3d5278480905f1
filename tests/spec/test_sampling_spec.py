"""SamplingSpec: a job's `sampling` stored and shown as submitted, its values read typed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from polar_mq.capability.sampling import sampling_policy
from polar_mq.jobs.schemas import JobCreate
from polar_mq.spec import JobSpec, SamplingSpec, load_spec

TASKS = [{"instruction": "x"}]
SUBMITTED: list[dict[str, Any]] = [
    {},
    {"temperature": 0.7, "max_tokens": 64},
    {"max_tokens": 64, "temperature": 1, "seed": None},  # its order, an int, an explicit null
    {"temperature": "hot", "enforce": "off"},  # not enforced, so not checked: kept as sent
    {"enforce": {"max_tokens": "override"}, "stop": ["\n"], "logit_bias": {"1": -100}},
]


@pytest.mark.parametrize("sampling", SUBMITTED)
def test_the_stored_sampling_is_the_submitted_one_byte_for_byte(sampling: dict[str, Any]) -> None:
    job = JobCreate(tasks=TASKS, sampling=sampling)
    stored = job.stored_spec()
    assert orjson.dumps(stored["sampling"]) == orjson.dumps(sampling)
    loaded = load_spec(stored)
    assert isinstance(loaded.sampling, SamplingSpec)
    assert orjson.dumps(loaded.stored()) == orjson.dumps(stored)  # a stage's read changes nothing
    assert loaded == job.job_spec("default")  # an idempotent resubmission compares equal


def test_the_platforms_values_read_typed() -> None:
    spec = SamplingSpec({"temperature": 0.5, "top_p": 1, "top_k": 20, "max_tokens": 64, "seed": 3})
    assert (spec.temperature, spec.top_p, spec.top_k, spec.max_tokens, spec.seed) == (
        0.5, 1, 20, 64, 3,
    )  # fmt: skip
    assert spec.enforce is None
    assert JobSpec().sampling == SamplingSpec() and JobSpec().sampling.root == {}


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": "hot", "max_tokens": "64", "seed": True, "enforce": "off"},
        {"temperature": float("nan"), "top_k": 2.5, "seed": None},
    ],
)
def test_a_value_that_is_no_number_reads_as_absent(sampling: dict[str, Any]) -> None:
    spec = SamplingSpec(sampling)
    assert (spec.temperature, spec.top_k, spec.max_tokens, spec.seed) == (None, None, None, None)
    assert spec.root == sampling  # still stored and shown as it came


def test_the_proxys_policy_comes_from_the_whole_mapping() -> None:
    spec = load_spec(JobCreate(tasks=TASKS, sampling={"max_tokens": 64}).stored_spec())
    assert sampling_policy(spec.sampling.root).as_dict() == {"max_tokens": ["clamp", 64]}


def test_the_spec_is_frozen() -> None:
    spec = SamplingSpec({"temperature": 0.5})
    with pytest.raises(ValueError):
        spec.root = {}  # type: ignore[misc]
