"""`prefix_merge`: the calls of one conversation become one training sample, token for token.

An agent that appends to its history unchanged sends, on every turn, a prompt whose token ids start
with the previous call's prompt + completion ids (checked on real vLLM). Such calls form a *chain*
and are merged into one sample instead of one sample per call (which repeats the whole history in
every sample and trains the same tokens again and again):

- `prompt_ids` is the first call's prompt; `response_ids` is the first completion, then for every
  later call the tokens between the previous completion and its prompt's end (tool results,
  template glue: "glue"), then its completion. So `prompt_ids + response_ids` equals the last
  call's prompt + completion exactly, and no token is ever re-tokenized.
- `loss_mask` is 1 on every token the model sampled, end-of-turn token included (the model chose to
  stop; it must learn that), and 0 on glue. A turn cut off by `max_tokens` has no end-of-turn token
  of its own; the one the chat template adds comes in as glue, with mask 0.
- `logprobs` are the engine's own for sampled tokens. Glue tokens were never sampled and have none:
  they get the placeholder `LOGPROB_PLACEHOLDER` = 0.0 (log 1), always under mask 0, so a trainer
  that multiplies by the mask ignores them and a placeholder can never pass for a sampled logprob
  of a trained token. If any call of a chain has no (or misaligned) logprobs, the sample's
  `logprobs` is null rather than partly invented.

Which chain a call extends: the chain whose current context (its last call's prompt + completion)
is the longest prefix of the call's prompt; ties go to the chain extended most recently. So
interleaved sub-agents, whose prompts extend only their own history, form separate chains. A call
that extends no chain starts a new one. When it still starts with some chain's opening prompt, it
is the same conversation with its history rewritten (an edited tool result, context compaction
that keeps the task, a retried turn): a *prefix break*, counted as `broken`. A new chain that does
not share a chain's opening prompt is a fresh conversation (a sub-agent, say); compaction that also
rewrites the opening prompt therefore counts as fresh, not broken.

Calls that failed (non-2xx status), are incomplete (no finish reason, or status 499: the agent
went away mid-answer) or lack token ids are skipped and counted; they never break a chain, since
a call that was never answered adds nothing to the history its successor extends.

Statistics per rollout: `calls`, `samples`, `skipped` (+ `skipped_error`, `skipped_incomplete`,
`skipped_missing_ids`), `chains`, `merged` (calls appended to an existing chain), `broken`.

Token-in/token-out calls (`prompt_source` `tito`, `polar_mq.proxy.tito`) extend their
predecessor by construction: the proxy sent the previous usable call's prompt + completion ids
followed by the new messages' ids. For those the chain is proven, not found: the call must
extend the chain of the call before it, which is checked (`tito_proven`; a `tito` call that does
not is counted in `tito_unproven`, a bug to report, and placed by the rule above). Calls the
proxy sent the chat way although TITO was on carry the reason (`tito_fallback`); the ones that
could have extended a conversation (all but its first call) are counted in `tito_fallbacks`, and
each sample lists its calls' `prompt_sources`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar_mq.trajectories.base import BuildResult, BuiltSample, CapturedCall
from polar_mq.trajectories.per_call import _messages as call_messages

LOGPROB_PLACEHOLDER = 0.0
"""The logprob stored for glue tokens (mask 0): they were not sampled, so they have none."""
STATUS_CLIENT_GONE = 499
"""The proxy's status for a call the agent abandoned mid-answer: incomplete rather than failed."""
TITO = "tito"
FIRST_CALL = "first_call"
"""The fallback of a conversation's first call: there was nothing to extend."""


def skip_reason(call: CapturedCall) -> str | None:
    """Why a call cannot be used ("error", "incomplete", "missing_ids"), or None if it can."""
    if call.status_code == STATUS_CLIENT_GONE or (
        call.status_code < 300 and not call.finish_reason
    ):
        return "incomplete"
    if not 200 <= call.status_code < 300:
        return "error"
    if not call.prompt_ids or call.completion_ids is None:
        return "missing_ids"
    return None


def _aligned_logprobs(call: CapturedCall) -> list[float] | None:
    completion = call.completion_ids or []
    if call.logprobs is None or len(call.logprobs) != len(completion):
        return None
    return list(call.logprobs)


@dataclass(slots=True)
class _Chain:
    """One sample under construction: the calls merged so far and what they add up to."""

    opening: list[int]
    context: list[int]
    calls: list[CapturedCall] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    prefix_break: bool = False
    last_used: int = 0

    @classmethod
    def start(cls, call: CapturedCall, *, prefix_break: bool, tick: int) -> _Chain:
        prompt = list(call.prompt_ids or [])
        chain = cls(opening=prompt, context=prompt, prefix_break=prefix_break)
        chain.add(call, tick)
        return chain

    def extended_by(self, prompt: list[int]) -> bool:
        n = len(self.context)
        return len(prompt) >= n and prompt[:n] == self.context

    def add(self, call: CapturedCall, tick: int) -> None:
        """Append the glue up to `call`'s prompt (mask 0), then its completion (mask 1)."""
        prompt = call.prompt_ids or []
        completion = call.completion_ids or []
        glue = prompt[len(self.context) :]
        self.response_ids += [*glue, *completion]
        self.loss_mask += [0] * len(glue) + [1] * len(completion)
        own = _aligned_logprobs(call)
        if self.logprobs is not None and own is not None:
            self.logprobs += [LOGPROB_PLACEHOLDER] * len(glue) + own
        else:
            self.logprobs = None
        self.context = [*prompt, *completion]
        self.calls.append(call)
        self.last_used = tick

    def sample(self) -> BuiltSample:
        versions = [call.policy_version for call in self.calls]
        last = self.calls[-1]
        return BuiltSample(
            prompt_ids=list(self.opening),
            response_ids=self.response_ids,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            messages=call_messages(last),
            meta={
                "call_ids": [call.call_id for call in self.calls],
                "seqs": [call.seq for call in self.calls],
                "policy_versions": versions,
                "min_policy_version": min(versions),
                "max_policy_version": max(versions),
                "finish_reason": last.finish_reason,
                "prefix_break": self.prefix_break,
                "prompt_sources": [call.prompt_source for call in self.calls],
            },
        )


class PrefixMergeBuilder:
    """Merges each chain of prefix-extending calls into one sample (see the module docstring)."""

    name = "prefix_merge"

    def build(self, calls: list[CapturedCall]) -> BuildResult:
        chains: list[_Chain] = []
        skipped = {"error": 0, "incomplete": 0, "missing_ids": 0}
        merged = broken = 0
        tito = {"proven": 0, "unproven": 0, "fallbacks": 0}
        previous: _Chain | None = None
        for tick, call in enumerate(sorted(calls, key=lambda c: c.seq), start=1):
            reason = skip_reason(call)
            if reason is not None:
                skipped[reason] += 1
                continue
            prompt = call.prompt_ids or []
            target = None
            if call.prompt_source == TITO:  # built on its predecessor: prove, don't search
                proven = previous is not None and previous.extended_by(prompt)
                tito["proven" if proven else "unproven"] += 1
                target = previous if proven else None
            elif call.tito_fallback is not None and call.tito_fallback != FIRST_CALL:
                tito["fallbacks"] += 1
            if target is None:
                target = self._longest_extended(chains, prompt)
            if target is not None:
                target.add(call, tick)
                merged += 1
                previous = target
                continue
            rewritten = any(prompt[: len(c.opening)] == c.opening for c in chains)
            broken += rewritten
            previous = _Chain.start(call, prefix_break=rewritten, tick=tick)
            chains.append(previous)
        stats: dict[str, Any] = {
            "calls": len(calls),
            "samples": len(chains),
            "skipped": sum(skipped.values()),
            **{f"skipped_{reason}": n for reason, n in skipped.items()},
            "chains": len(chains),
            "merged": merged,
            "broken": broken,
            "tito_proven": tito["proven"],
            "tito_unproven": tito["unproven"],
            "tito_fallbacks": tito["fallbacks"],
        }
        return BuildResult([chain.sample() for chain in chains], stats)

    @staticmethod
    def _longest_extended(chains: list[_Chain], prompt: list[int]) -> _Chain | None:
        """The chain whose context is the longest prefix of `prompt` (latest used on a tie)."""
        candidates = [chain for chain in chains if chain.extended_by(prompt)]
        if not candidates:
            return None
        return max(candidates, key=lambda chain: (len(chain.context), chain.last_used))
