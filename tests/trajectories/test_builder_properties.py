"""Property tests of both builders on generated rollouts (hypothesis).

A rollout is generated the way agents produce one: several conversations (sub-agents) interleave;
each turn appends glue (tool output, template tokens) and a sampled completion to its history;
sometimes a history is rewritten from some point on (compaction, an edited tool result); failed,
abandoned and id-less calls are sprinkled in. The generator knows which history segment each call
belongs to, and that is the oracle for the chains `prefix_merge` must find.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from trajectory_support import assert_merge_invariants, assert_shapes

from polar_mq.trajectories.base import CapturedCall
from polar_mq.trajectories.per_call import PerCallBuilder
from polar_mq.trajectories.prefix_merge import PrefixMergeBuilder

END_OF_TURN = 2


@dataclass
class Conversation:
    opening: list[int]
    history: list[int]
    segment: int = 0
    turns: int = 0


@dataclass
class Rollout:
    calls: list[CapturedCall] = field(default_factory=list)
    segment_of: dict[str, tuple[int, int]] = field(default_factory=dict)
    rewrites: int = 0


def _tokens(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(3, 60) for _ in range(rng.randint(low, high))]


def _call(rollout: Rollout, rng: random.Random, **fields: object) -> CapturedCall:
    completion = fields.get("completion_ids")
    sampled = completion if isinstance(completion, list) else []
    has_logprobs = isinstance(completion, list) and rng.random() > 0.1
    values = {
        "seq": len(rollout.calls),
        "call_id": str(uuid.UUID(int=rng.getrandbits(128))),
        "prompt_ids": None,
        "completion_ids": None,
        "logprobs": [-rng.random() * 5 for _ in sampled] if has_logprobs else None,
        "finish_reason": None,
        "policy_version": rng.randint(0, 3),
        "status_code": 200,
        "request": {"messages": [{"role": "user", "content": "x"}]},
        "response": None,
        **fields,
    }
    call = CapturedCall(**values)  # type: ignore[arg-type]
    rollout.calls.append(call)
    return call


def _turn(rollout: Rollout, rng: random.Random, index: int, conv: Conversation) -> None:
    glue = _tokens(rng, 0, 5) if conv.turns else []
    prompt = conv.history + glue
    completion = _tokens(rng, 0, 6) + ([END_OF_TURN] if rng.random() < 0.7 else [])
    finish = "stop" if completion[-1:] == [END_OF_TURN] else "length"
    call = _call(rollout, rng, prompt_ids=prompt, completion_ids=completion, finish_reason=finish)
    rollout.segment_of[call.call_id] = (index, conv.segment)
    conv.history = prompt + completion
    conv.turns += 1


def _rewrite(rng: random.Random, conv: Conversation, fresh: int) -> bool:
    """Rewrite the history after the opening from some point on; False if there is nothing to."""
    if len(conv.history) <= len(conv.opening):
        return False
    cut = rng.randrange(len(conv.opening), len(conv.history))
    conv.history = [*conv.history[:cut], fresh, *_tokens(rng, 0, 4)]
    conv.segment += 1
    conv.turns = 0
    return True


def _failure(rollout: Rollout, rng: random.Random, conv: Conversation) -> None:
    kind = rng.choice(["refused", "abandoned", "cut", "no_ids"])
    partial = _tokens(rng, 0, 3)
    if kind == "refused":
        _call(rollout, rng, status_code=rng.choice([400, 500, 502]), response={"error": "x"})
    elif kind == "abandoned":
        _call(rollout, rng, status_code=499, prompt_ids=conv.history, completion_ids=partial)
    elif kind == "cut":
        _call(rollout, rng, prompt_ids=conv.history, completion_ids=partial)
    else:
        _call(rollout, rng, completion_ids=partial, finish_reason="stop")


@st.composite
def rollouts(draw: st.DrawFn) -> Rollout:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n_conversations = draw(st.integers(1, 3))
    conversations = [
        Conversation(opening=(o := [1000 + i, *_tokens(rng, 1, 6)]), history=list(o))
        for i in range(n_conversations)
    ]
    rollout = Rollout()
    for step in range(draw(st.integers(0, 14))):
        index = rng.randrange(n_conversations)
        conv = conversations[index]
        action = rng.choices(["turn", "rewrite", "failure"], [6, 1, 1])[0]
        if action == "rewrite" and conv.turns and _rewrite(rng, conv, 2000 + step):
            rollout.rewrites += 1
            _turn(rollout, rng, index, conv)
        elif action == "failure":
            _failure(rollout, rng, conv)
        else:
            _turn(rollout, rng, index, conv)
    return rollout


def _expected_chains(rollout: Rollout) -> list[list[int]]:
    groups: dict[tuple[int, int], list[int]] = {}
    for call in rollout.calls:
        if call.call_id in rollout.segment_of:
            groups.setdefault(rollout.segment_of[call.call_id], []).append(call.seq)
    return sorted(groups.values())


@settings(max_examples=300, deadline=None)
@given(rollouts())
def test_prefix_merge_invariants(rollout: Rollout) -> None:
    assert_merge_invariants(rollout.calls, PrefixMergeBuilder().build(rollout.calls))


@settings(max_examples=300, deadline=None)
@given(rollouts())
def test_prefix_merge_finds_exactly_the_generated_histories(rollout: Rollout) -> None:
    result = PrefixMergeBuilder().build(rollout.calls)
    expected = _expected_chains(rollout)
    assert sorted(s.meta["seqs"] for s in result.samples) == expected
    usable = sum(len(chain) for chain in expected)
    assert result.stats["chains"] == len(expected)
    assert result.stats["merged"] == usable - len(expected)
    assert result.stats["broken"] == rollout.rewrites
    assert result.stats["skipped"] == len(rollout.calls) - usable
    assert sum(s.meta["prefix_break"] for s in result.samples) == rollout.rewrites


@settings(max_examples=100, deadline=None)
@given(rollouts(), st.randoms(use_true_random=False))
def test_prefix_merge_ignores_input_order(rollout: Rollout, rng: random.Random) -> None:
    shuffled = list(rollout.calls)
    rng.shuffle(shuffled)
    ordered = PrefixMergeBuilder().build(rollout.calls)
    result = PrefixMergeBuilder().build(shuffled)
    assert [(s.meta["call_ids"], s.response_ids) for s in result.samples] == [
        (s.meta["call_ids"], s.response_ids) for s in ordered.samples
    ]


@settings(max_examples=300, deadline=None)
@given(rollouts())
def test_per_call_one_sample_per_answered_call(rollout: Rollout) -> None:
    result = PerCallBuilder().build(rollout.calls)
    answered = [
        c
        for c in rollout.calls
        if c.status_code == 200 and c.prompt_ids and c.completion_ids is not None
    ]
    assert [s.meta["call_ids"] for s in result.samples] == [[c.call_id] for c in answered]
    assert result.stats["skipped"] == len(rollout.calls) - len(answered)
    for sample, call in zip(result.samples, answered, strict=True):
        assert_shapes(sample)
        assert sample.prompt_ids == call.prompt_ids
        assert sample.response_ids == call.completion_ids
        assert sample.loss_mask == [1] * len(sample.response_ids)
        assert sample.logprobs == call.logprobs
        assert sample.meta["policy_versions"] == [call.policy_version]
