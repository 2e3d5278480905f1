"""`per_call`: one training sample per successful LLM call, tokens exactly as the engine sampled."""

from __future__ import annotations

from typing import Any

from polar_mq.trajectories.base import BuildResult, BuiltSample, CapturedCall


def _messages(call: CapturedCall) -> list[Any] | None:
    request_messages = call.request.get("messages")
    if request_messages is None:
        return None
    reply: Any = None
    if call.response:
        choices = call.response.get("choices") or []
        reply = choices[0].get("message") if choices else call.response.get("message")
    return [*request_messages, reply] if reply is not None else list(request_messages)


class PerCallBuilder:
    name = "per_call"

    def build(self, calls: list[CapturedCall]) -> BuildResult:
        samples: list[BuiltSample] = []
        skipped = 0
        for call in calls:
            if call.status_code != 200 or not call.prompt_ids or call.completion_ids is None:
                skipped += 1
                continue
            logprobs = call.logprobs
            if logprobs is not None and len(logprobs) != len(call.completion_ids):
                logprobs = None
            samples.append(
                BuiltSample(
                    prompt_ids=list(call.prompt_ids),
                    response_ids=list(call.completion_ids),
                    loss_mask=[1] * len(call.completion_ids),
                    logprobs=logprobs,
                    messages=_messages(call),
                    meta={
                        "call_ids": [call.call_id],
                        "seqs": [call.seq],
                        "policy_versions": [call.policy_version],
                        "finish_reason": call.finish_reason,
                    },
                )
            )
        return BuildResult(
            samples, {"calls": len(calls), "samples": len(samples), "skipped": skipped}
        )
