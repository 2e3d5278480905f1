"""Rules of `prefix_merge` shown on hand-made calls; `per_call` on the recordings; the registry."""

from __future__ import annotations

import pytest
from trajectory_support import SCENARIOS, assert_shapes, decode, load_calls, sampled_text

from polar_mq.trajectories.base import CapturedCall
from polar_mq.trajectories.per_call import PerCallBuilder
from polar_mq.trajectories.prefix_merge import PrefixMergeBuilder, skip_reason
from polar_mq.trajectories.registry import get_builder, validate_builder_name


def call(seq: int, prompt: list[int], completion: list[int], **kw: object) -> CapturedCall:
    """A hand-made answered call; `kw` overrides any field."""
    values: dict[str, object] = {
        "seq": seq,
        "call_id": f"c{seq}",
        "prompt_ids": prompt,
        "completion_ids": completion,
        "logprobs": [-0.5] * len(completion or []),
        "finish_reason": "stop",
        "policy_version": 0,
        "status_code": 200,
        "request": {"messages": []},
        "response": None,
        **kw,
    }
    return CapturedCall(**values)  # type: ignore[arg-type]


def test_longest_matching_chain_wins() -> None:
    """Chain 0 holds a long history; chain 1 replays a prefix of it; the next call extends both
    contexts and must go to the longer one (chain 0), whose history it actually continues."""
    calls = [
        call(0, [9, 1, 2, 3], [4, 5]),  # context 9 1 2 3 4 5
        call(1, [9, 1], [2, 3]),  # context 9 1 2 3: a prefix of chain 0's context
        call(2, [9, 1, 2, 3, 4, 5, 6], [7]),
    ]
    result = PrefixMergeBuilder().build(calls)
    assert sorted(s.meta["seqs"] for s in result.samples) == [[0, 2], [1]]


def test_equal_contexts_go_to_the_chain_extended_last() -> None:
    calls = [
        call(0, [9, 1], [2]),
        call(1, [9, 1], [2]),  # the same turn sampled again: a second chain, same context
        call(2, [9, 1, 2, 3], [4]),
    ]
    result = PrefixMergeBuilder().build(calls)
    assert sorted(s.meta["seqs"] for s in result.samples) == [[0], [1, 2]]
    assert result.stats["broken"] == 1


def test_prompt_equal_to_the_context_merges_with_no_glue() -> None:
    calls = [call(0, [9, 1], [2, 3], finish_reason="length"), call(1, [9, 1, 2, 3], [4, 2])]
    (sample,) = PrefixMergeBuilder().build(calls).samples
    assert sample.response_ids == [2, 3, 4, 2] and sample.loss_mask == [1, 1, 1, 1]


def test_a_new_task_is_a_fresh_chain_not_a_break() -> None:
    calls = [call(0, [9, 1, 5], [2]), call(1, [9, 7, 5], [2])]
    result = PrefixMergeBuilder().build(calls)
    assert result.stats["chains"] == 2 and result.stats["broken"] == 0


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"status_code": 500}, "error"),
        ({"status_code": 400, "prompt_ids": None, "completion_ids": None}, "error"),
        ({"status_code": 499}, "incomplete"),
        ({"finish_reason": None}, "incomplete"),
        ({"prompt_ids": None}, "missing_ids"),
        ({"prompt_ids": []}, "missing_ids"),
        ({"completion_ids": None}, "missing_ids"),
        ({}, None),
    ],
)
def test_skip_reasons(changes: dict[str, object], reason: str | None) -> None:
    assert skip_reason(call(0, [9, 1], [2], **changes)) == reason


@pytest.mark.parametrize("name", SCENARIOS)
def test_per_call_on_recordings(name: str) -> None:
    calls = load_calls(name)
    result = PerCallBuilder().build(calls)
    answered = [c for c in calls if c.status_code == 200]
    assert len(result.samples) == len(answered)
    skipped = len(calls) - len(answered)
    assert result.stats == {"calls": len(calls), "samples": len(answered), "skipped": skipped}
    for sample, source in zip(result.samples, answered, strict=True):
        assert_shapes(sample)
        assert sample.prompt_ids + sample.response_ids == [
            *(source.prompt_ids or []),
            *(source.completion_ids or []),
        ]
        assert set(sample.loss_mask) == {1}
        assert decode(sample.response_ids) == sampled_text(source)
        assert sample.logprobs == source.logprobs
        assert sample.meta["call_ids"] == [source.call_id]


def test_registry_knows_both_builders_and_import_paths() -> None:
    assert isinstance(get_builder("prefix_merge"), PrefixMergeBuilder)
    assert isinstance(get_builder("per_call"), PerCallBuilder)
    path = "polar_mq.trajectories.prefix_merge:PrefixMergeBuilder"
    assert isinstance(get_builder(path), PrefixMergeBuilder)
    validate_builder_name("prefix_merge")
    with pytest.raises(ValueError, match="prefix_merge"):
        get_builder("prefix-merge")
    with pytest.raises(ValueError, match="cannot import"):
        get_builder("polar_mq.trajectories.prefix_merge:Nope")
