"""`prefix_merge` on real recorded vLLM conversations (tests/fixtures/vllm_multiturn).

Expected chains come from the histories the capture script built (each call's `label`), never from
the builder; decoded text comes from the server's own detokenization recorded with the fixtures.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from trajectory_support import (
    END_OF_TURN,
    END_OF_TURN_ID,
    SCENARIOS,
    assert_merge_invariants,
    decode,
    labels,
    load_calls,
    runs,
    sampled_text,
    usable,
)

from polar_mq.trajectories.base import BuiltSample, CapturedCall
from polar_mq.trajectories.prefix_merge import LOGPROB_PLACEHOLDER, PrefixMergeBuilder

BUILDER = PrefixMergeBuilder()


def expected_chains(name: str) -> list[list[int]]:
    """Seqs of the usable calls grouped by the history label they were built on."""
    groups: dict[str, list[int]] = defaultdict(list)
    label_of = labels(name)
    for call in load_calls(name):
        if usable(call):
            groups[label_of[call.call_id]].append(call.seq)
    return sorted(groups.values())


def rendered(message: dict[str, str]) -> str:
    """A non-assistant message as SmolLM2's chat template renders it."""
    return f"<|im_start|>{message['role']}\n{message['content']}{END_OF_TURN}\n"


@pytest.mark.parametrize("name", SCENARIOS)
def test_invariants_hold_on_every_recording(name: str) -> None:
    calls = load_calls(name)
    assert_merge_invariants(calls, BUILDER.build(calls))


@pytest.mark.parametrize("name", SCENARIOS)
def test_one_sample_per_history(name: str) -> None:
    result = BUILDER.build(load_calls(name))
    assert sorted(s.meta["seqs"] for s in result.samples) == expected_chains(name)
    assert result.stats["chains"] == result.stats["samples"] == len(expected_chains(name))
    n_usable = sum(len(chain) for chain in expected_chains(name))
    assert result.stats["merged"] == n_usable - len(expected_chains(name))


def test_tool_call_conversation_trains_exactly_the_model_turns() -> None:
    """Masked-in runs decode to the assistant turns; glue decodes to the tool messages."""
    calls = load_calls("tool_calls")
    (sample,) = BUILDER.build(calls).samples
    assert len(calls) >= 3 and sample.meta["seqs"] == [c.seq for c in calls]
    roles = [m["role"] for m in calls[-1].request["messages"]]
    assert "tool" in roles
    trained = runs(sample.loss_mask, 1)
    glue = runs(sample.loss_mask, 0)
    assert len(trained) == len(calls) and len(glue) == len(calls) - 1
    for call, (start, end) in zip(calls, trained, strict=True):
        text = decode(sample.response_ids[start:end])
        assert text == sampled_text(call)
        content = call.response["choices"][0]["message"]["content"] if call.response else None
        ended = call.finish_reason == "stop"
        assert text == (content or "") + (END_OF_TURN if ended else "")
    for (start, end), before, after in zip(glue, calls[:-1], calls[1:], strict=True):
        new = after.request["messages"][len(before.request["messages"]) + 1 :]
        opener = "" if before.finish_reason == "stop" else END_OF_TURN
        expected = opener + "\n" + "".join(map(rendered, new)) + "<|im_start|>assistant\n"
        assert decode(sample.response_ids[start:end]) == expected
        assert sample.logprobs is not None
        assert set(sample.logprobs[start:end]) == {LOGPROB_PLACEHOLDER}


def test_end_of_turn_sampled_by_the_model_is_trained() -> None:
    calls = [c for c in load_calls("tool_calls") if c.finish_reason == "stop"]
    assert calls, "the recording has a turn the model ended itself"
    (sample,) = BUILDER.build(load_calls("tool_calls")).samples
    ends = [i for i, t in enumerate(sample.response_ids) if t == END_OF_TURN_ID]
    trained_ends = [i for i in ends if sample.loss_mask[i] == 1]
    assert len(trained_ends) == len(calls)
    assert sample.logprobs is not None
    own = [c.logprobs[-1] for c in calls if c.logprobs]
    assert [sample.logprobs[i] for i in trained_ends] == own


def test_turns_cut_by_max_tokens_get_the_template_end_of_turn_as_glue() -> None:
    calls = load_calls("length_cut")
    assert all(c.finish_reason == "length" for c in calls)
    (sample,) = BUILDER.build(calls).samples
    glue = runs(sample.loss_mask, 0)
    assert len(glue) == len(calls) - 1
    assert all(sample.response_ids[start] == END_OF_TURN_ID for start, _ in glue)
    pairs = zip(sample.response_ids, sample.loss_mask, strict=True)
    assert END_OF_TURN_ID not in [t for t, m in pairs if m]


def test_interleaved_sub_agents_form_one_chain_each() -> None:
    result = BUILDER.build(load_calls("interleaved"))
    label_of = labels("interleaved")
    assert len(result.samples) == 2
    for sample in result.samples:
        assert len({label_of[i] for i in sample.meta["call_ids"]}) == 1
        assert sample.meta["prefix_break"] is False
    assert result.stats["broken"] == 0 and result.stats["merged"] == 4


def test_rewritten_history_starts_a_new_sample_counted_as_broken() -> None:
    calls = load_calls("prefix_break")
    result = BUILDER.build(calls)
    first, second = result.samples
    assert [first.meta["prefix_break"], second.meta["prefix_break"]] == [False, True]
    assert result.stats["broken"] == 1
    assert second.prompt_ids == calls[first.meta["seqs"][-1] + 1].prompt_ids
    trimmed = calls[-1].request["messages"][2]["content"]
    assert trimmed.endswith("[trimmed]") and trimmed in decode(second.prompt_ids)


def test_retokenized_turn_is_a_break_although_the_text_still_matches() -> None:
    """The model sampled a token sequence the template encodes differently: same text, new ids."""
    calls = load_calls("retokenized")
    label_of = labels("retokenized")
    breaking = next(c for c in calls if label_of[c.call_id] == "main#retokenized")
    before = calls[breaking.seq - 1]
    context = [*(before.prompt_ids or []), *(before.completion_ids or [])]
    assert (breaking.prompt_ids or [])[: len(context)] != context
    assert decode(breaking.prompt_ids or []).startswith(decode(context))
    result = BUILDER.build(calls)
    assert result.stats["broken"] == 1 and len(result.samples) == 2


def test_failed_and_incomplete_calls_are_skipped_and_never_break_the_chain() -> None:
    calls = load_calls("failures")
    statuses = [c.status_code for c in calls]
    assert 400 in statuses and 499 in statuses
    result = BUILDER.build(calls)
    (sample,) = result.samples
    assert sample.meta["seqs"] == [c.seq for c in calls if c.status_code == 200]
    assert result.stats["skipped_error"] == 1
    assert result.stats["skipped_incomplete"] == 1
    assert result.stats["skipped"] == 2 and result.stats["calls"] == 4


def test_messages_are_the_last_calls_history_and_reply() -> None:
    calls = load_calls("tool_calls")
    (sample,) = BUILDER.build(calls).samples
    assert calls[-1].response is not None
    reply = calls[-1].response["choices"][0]["message"]
    assert sample.messages == [*calls[-1].request["messages"], reply]


def _with(call: CapturedCall, **changes: object) -> CapturedCall:
    fields = {name: getattr(call, name) for name in CapturedCall.__dataclass_fields__}
    return CapturedCall(**{**fields, **changes})


def test_one_call_without_logprobs_nulls_the_samples_logprobs_only() -> None:
    calls = load_calls("interleaved")
    calls[2] = _with(calls[2], logprobs=None)
    calls[3] = _with(calls[3], logprobs=(calls[3].logprobs or [])[:-1])  # misaligned
    result = BUILDER.build(calls)
    assert all(s.logprobs is None for s in result.samples)
    assert_merge_invariants(calls, result)
    kept = BUILDER.build(load_calls("interleaved"))
    assert all(s.logprobs is not None for s in kept.samples)


def test_policy_versions_per_merged_call() -> None:
    versions = [3, 4, 4, 6]
    calls = [
        _with(c, policy_version=v) for c, v in zip(load_calls("tool_calls"), versions, strict=True)
    ]
    sample: BuiltSample = BUILDER.build(calls).samples[0]
    assert sample.meta["policy_versions"] == versions
    assert (sample.meta["min_policy_version"], sample.meta["max_policy_version"]) == (3, 6)


def test_calls_given_out_of_order_are_merged_by_sequence_number() -> None:
    calls = load_calls("interleaved")
    forward = BUILDER.build(calls)
    backward = BUILDER.build(list(reversed(calls)))
    assert [s.response_ids for s in backward.samples] == [s.response_ids for s in forward.samples]
    assert backward.stats == forward.stats


def test_no_calls_no_samples() -> None:
    result = BUILDER.build([])
    assert result.samples == []
    assert result.stats["calls"] == 0 and result.stats["chains"] == 0
