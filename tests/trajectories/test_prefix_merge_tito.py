"""`prefix_merge` and token-in/token-out calls: a `tito` call's chain is proven, not searched.

A `tito` call's prompt was built by the proxy from the previous usable call's prompt +
completion, so it must extend that call's chain; the builder checks it (`tito_proven`), counts a
`tito` call that does not (`tito_unproven`: a bug) and the calls that fell back after a
conversation's first (`tito_fallbacks`), and lists each sample's `prompt_sources`.
"""

from __future__ import annotations

from typing import Any

from trajectory_support import assert_merge_invariants

from polar_mq.trajectories.base import CapturedCall
from polar_mq.trajectories.prefix_merge import PrefixMergeBuilder


def call(seq: int, prompt: list[int], completion: list[int], **extra: Any) -> CapturedCall:
    values: dict[str, Any] = {
        "seq": seq,
        "call_id": f"c{seq}",
        "prompt_ids": prompt,
        "completion_ids": completion,
        "logprobs": [-0.5] * len(completion),
        "finish_reason": "stop",
        "policy_version": 0,
        "status_code": 200,
        "request": {"messages": []},
        "response": None,
        **extra,
    }
    return CapturedCall(**values)


def test_tito_calls_are_proven_extensions_of_the_call_before() -> None:
    calls = [
        call(0, [1, 2], [3, 9], tito_fallback="first_call"),
        call(1, [1, 2, 3, 9, 4], [5, 9], prompt_source="tito"),
        call(2, [1, 2, 3, 9, 4, 5, 9, 6], [7, 9], prompt_source="tito"),
    ]
    result = PrefixMergeBuilder().build(calls)
    assert result.stats["samples"] == 1 and result.stats["merged"] == 2
    assert result.stats["tito_proven"] == 2 and result.stats["tito_unproven"] == 0
    assert result.stats["tito_fallbacks"] == 0  # a first call has nothing to extend
    assert result.samples[0].meta["prompt_sources"] == ["chat", "tito", "tito"]
    assert_merge_invariants(calls, result)


def test_a_fallback_starts_a_segment_and_is_counted() -> None:
    calls = [
        call(0, [1, 2], [3, 9], tito_fallback="first_call"),
        call(1, [1, 2, 8], [5, 9], tito_fallback="history_rewritten"),  # compacted
        call(2, [1, 2, 8, 5, 9, 6], [7, 9], prompt_source="tito"),
    ]
    result = PrefixMergeBuilder().build(calls)
    assert result.stats["samples"] == 2 and result.stats["broken"] == 1
    assert result.stats["tito_fallbacks"] == 1 and result.stats["tito_proven"] == 1
    assert [s.meta["prompt_sources"] for s in result.samples] == [["chat"], ["chat", "tito"]]
    assert_merge_invariants(calls, result)


def test_a_tito_call_that_does_not_extend_its_predecessor_is_reported() -> None:
    """It is placed by the ordinary rule (here: the older chain it does extend)."""
    calls = [
        call(0, [1, 2], [3, 9]),
        call(1, [7, 7], [5, 9]),
        call(2, [1, 2, 3, 9, 4], [6, 9], prompt_source="tito"),
    ]
    result = PrefixMergeBuilder().build(calls)
    assert result.stats["tito_unproven"] == 1 and result.stats["tito_proven"] == 0
    assert result.stats["samples"] == 2
    assert result.samples[0].meta["call_ids"] == ["c0", "c2"]
    assert_merge_invariants(calls, result)


def test_a_skipped_call_in_between_does_not_unprove_the_next() -> None:
    """A failed call adds nothing to the history: the next `tito` call extends the one before."""
    calls = [
        call(0, [1, 2], [3, 9]),
        call(1, [1, 2, 3, 9, 4], [], status_code=502, finish_reason=None),
        call(2, [1, 2, 3, 9, 4], [5, 9], prompt_source="tito"),
    ]
    result = PrefixMergeBuilder().build(calls)
    assert result.stats["tito_proven"] == 1 and result.stats["samples"] == 1
