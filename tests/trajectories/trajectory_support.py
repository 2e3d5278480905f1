"""Recorded vLLM calls (tests/fixtures/vllm_multiturn) and the invariants every builder must keep.

The fixtures are real vLLM 0.32 CPU responses (SmolLM2-135M-Instruct) recorded by
`scripts/capture_vllm_multiturn.py`; each call carries the `label` of the history the script built
it on, which is the ground truth the tests compare the builders' chains with.
"""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path
from typing import Any

from polar_mq.trajectories.base import BuildResult, BuiltSample, CapturedCall
from polar_mq.trajectories.prefix_merge import LOGPROB_PLACEHOLDER

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm_multiturn"
SCENARIOS = ("tool_calls", "interleaved", "prefix_break", "length_cut", "retokenized", "failures")
END_OF_TURN_ID = 2
END_OF_TURN = "<|im_end|>"
FIELDS = CapturedCall.__dataclass_fields__


@cache
def _document(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data


def records(name: str) -> list[dict[str, Any]]:
    """The raw recorded calls of a scenario, `label` included."""
    calls: list[dict[str, Any]] = _document(name)["calls"]
    return calls


def load_calls(name: str) -> list[CapturedCall]:
    return [CapturedCall(**{k: v for k, v in r.items() if k in FIELDS}) for r in records(name)]


def labels(name: str) -> dict[str, str]:
    """call id -> the history label the capture script built the call on."""
    return {r["call_id"]: r["label"] for r in records(name)}


@cache
def _vocab() -> dict[int, bytes]:
    raw = json.loads((FIXTURES / "vocab.json").read_text(encoding="utf-8"))
    return {int(k): bytes.fromhex(v) for k, v in raw.items()}


def decode(ids: list[int]) -> str:
    """Text of `ids` from the bytes of each token as the server reported them (vocab.json)."""
    vocab = _vocab()
    return b"".join(vocab[i] for i in ids).decode("utf-8")


def sampled_text(call: CapturedCall) -> str:
    """What the model generated in `call`, from the per-token bytes the server returned."""
    assert call.response is not None
    content = call.response["choices"][0]["logprobs"]["content"]
    return b"".join(bytes(entry["bytes"]) for entry in content).decode("utf-8")


def runs(mask: list[int], value: int) -> list[tuple[int, int]]:
    """(start, end) of the maximal runs of `value` in `mask`."""
    out: list[tuple[int, int]] = []
    start = None
    for i, bit in enumerate([*mask, -1]):
        if bit == value and start is None:
            start = i
        elif bit != value and start is not None:
            out.append((start, i))
            start = None
    return out


def usable(call: CapturedCall) -> bool:
    return (
        200 <= call.status_code < 300
        and call.finish_reason is not None
        and bool(call.prompt_ids)
        and call.completion_ids is not None
    )


def assert_shapes(sample: BuiltSample) -> None:
    assert len(sample.loss_mask) == len(sample.response_ids)
    assert set(sample.loss_mask) <= {0, 1}
    assert sample.logprobs is None or len(sample.logprobs) == len(sample.response_ids)


def assert_merge_invariants(calls: list[CapturedCall], result: BuildResult) -> None:
    """The invariants of issue 4 for a merging builder, checked against the input calls alone.

    - shapes: mask and logprobs as long as the response;
    - every token a usable call sampled is in exactly one sample, under mask 1, in call order,
      with its own logprob; every other response token is glue: mask 0, placeholder logprob;
    - prompt + response of a sample equals its last call's prompt + completion;
    - within a sample, each call's prompt starts with the previous call's prompt + completion.
    """
    by_id = {call.call_id: call for call in calls}
    seen: list[str] = []
    for sample in result.samples:
        assert_shapes(sample)
        members = [by_id[call_id] for call_id in sample.meta["call_ids"]]
        seen += sample.meta["call_ids"]
        assert sample.meta["seqs"] == [c.seq for c in members]
        assert sample.meta["policy_versions"] == [c.policy_version for c in members]
        assert sample.meta["min_policy_version"] == min(c.policy_version for c in members)
        assert sample.meta["max_policy_version"] == max(c.policy_version for c in members)
        last = members[-1]
        assert sample.prompt_ids + sample.response_ids == [
            *(last.prompt_ids or []),
            *(last.completion_ids or []),
        ]
        assert sample.prompt_ids == members[0].prompt_ids
        for before, after in itertools.pairwise(members):
            context = [*(before.prompt_ids or []), *(before.completion_ids or [])]
            assert (after.prompt_ids or [])[: len(context)] == context
        trained = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
        assert trained == [t for c in members for t in c.completion_ids or []]
        if sample.logprobs is not None:
            assert all(c.logprobs is not None for c in members)
            pairs = list(zip(sample.logprobs, sample.loss_mask, strict=True))
            assert [lp for lp, m in pairs if m] == [lp for c in members for lp in c.logprobs or []]
            assert all(lp == LOGPROB_PLACEHOLDER for lp, m in pairs if not m)
    assert sorted(seen) == sorted(c.call_id for c in calls if usable(c))
