"""A trajectory as a person reads it: text, trained tokens highlighted, logprobs on hover.

Each training sample becomes its prompt (decoded, shown folded) and its response as a list of
token pieces. Consecutive tokens with the same loss mask and no logprob to show are merged into
one piece, so a long tool output is one element on the page; a trained token (mask 1) stays its
own piece so hovering shows its logprob.

Segments (token-in/token-out, `polar_mq.proxy.tito`): each sample of `prefix_merge` is one
segment of the rollout, a run of calls each extending the one before. The page says why each
segment starts (the attempt's first call, a TITO fallback and its reason, a prefix break) and
marks, inside the response, where each call's part begins and how its prompt was built (`tito`:
the previous ids plus the new messages'; `chat`: the engine rendered the messages), so a reader
sees where and why a rollout was split without opening the calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polar_mq.jobs.read_models import LlmCallRecord, TrajectorySampleRecord
from polar_mq.ui.tokens_text import TokenDecoder, token_texts

MAX_TOKENS_SHOWN = 20_000
"""Per sample: a longer response is cut (the page says so) to keep the page light."""
TITO = "tito"
FIRST_CALL = "first_call"
FALLBACKS = {
    FIRST_CALL: "the attempt's first call: nothing to extend yet",
    "history_rewritten": "the agent rewrote its earlier messages",
    "reply_edited": "the last reply was not sent back as the agent got it",
    "reply_dropped": "the agent left its last reply out of the history",
    "tools_changed": "the tools offered changed",
    "no_new_messages": "the call added nothing after the reply",
    "template_not_incremental": "the template re-renders earlier turns when new ones are added",
    "tokenize_failed": "the engine's /tokenize did not answer",
    "store_unavailable": "the turn store (Redis) was unreachable",
}
"""The reasons of `polar_mq.proxy.tito` (docs/tito.md) in words; any other is an option name."""


def fallback_text(reason: str) -> str:
    return FALLBACKS.get(reason, f"the option {reason} is honoured only on the chat path")


@dataclass(frozen=True, slots=True)
class CallMark:
    """One call of a sample: its number, how its prompt was built and why it fell back."""

    seq: int
    source: str
    """`tito` or `chat` (`llm_calls.prompt_source`)."""
    fallback: str | None
    """Why TITO sent it the chat way (`llm_calls.tito_fallback`); None: token-in or TITO off."""

    @property
    def label(self) -> str:
        return f"call {self.seq} · {self.source}" + (f" ({self.fallback})" if self.fallback else "")

    @property
    def why(self) -> str:
        if self.source == TITO:
            return "token-in: the previous call's prompt and completion ids plus the new messages"
        if self.fallback is None:
            return "chat: the engine rendered the messages (TITO off)"
        return f"chat: {fallback_text(self.fallback)}"


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    trained: bool
    title: str
    """Token id(s) and logprob, shown on hover."""
    mark: CallMark | None = None
    """Set on the empty piece placed where a call's part of the response begins."""


@dataclass(frozen=True, slots=True)
class SampleView:
    sample_index: int
    builder: str
    prompt_text: str
    n_prompt: int
    pieces: list[Piece]
    n_response: int
    n_trained: int
    cut: bool
    meta: Mapping[str, object]
    calls: tuple[CallMark, ...] = ()
    """The calls merged into this sample, in order (empty when they are no longer stored)."""
    segment: str = ""
    """Why this sample starts a segment of its own (empty: not known)."""
    segment_kind: str = ""
    """`start` (the conversation's first call), `fallback` (TITO fell back) or `break`."""


def _text(texts: Mapping[int, str], token_id: int) -> str:
    return texts.get(token_id, f"⟨{token_id}⟩")


def _marks(
    sample: TrajectorySampleRecord, calls: Mapping[str, LlmCallRecord]
) -> list[tuple[int, CallMark]]:
    """Each call of the sample and the response position where its part begins.

    The first call's completion opens the response; each later call's part (its glue, then its
    completion) begins where the previous call's prompt + completion ended. Empty when a call is
    no longer stored (the positions follow from every call before)."""
    ids = sample.meta.get("call_ids")
    if not isinstance(ids, list) or not ids:
        return []
    found = [calls.get(str(i)) for i in ids]
    if any(c is None for c in found):
        return []
    marks: list[tuple[int, CallMark]] = []
    before: LlmCallRecord | None = None
    for call in found:
        assert call is not None
        pos = 0
        if before is not None:
            pos = len(before.prompt_ids or ()) + len(before.completion_ids or ())
            pos -= len(sample.prompt_ids)
        marks.append((max(pos, 0), CallMark(call.seq, call.prompt_source, call.tito_fallback)))
        before = call
    return marks


def segment_start(sample: TrajectorySampleRecord, first: CallMark | None) -> tuple[str, str]:
    """Why `sample` is a segment of its own, and its kind (`start`, `fallback`, `break`)."""
    if first is None:
        return "", ""
    if sample.builder != "prefix_merge":
        return f"one sample per call ({sample.builder})", "start"
    if first.fallback == FIRST_CALL:
        return "the attempt's first call", "start"
    if first.fallback is not None:
        return f"TITO fell back ({first.fallback}): {fallback_text(first.fallback)}", "fallback"
    if first.source == TITO:
        return "a token-in call that does not extend the chain before it (a bug)", "break"
    if sample.meta.get("prefix_break"):
        return "prefix break: the engine's prompt no longer extends the earlier turns", "break"
    if sample.sample_index == 0:
        return "the attempt's first call", "start"
    return "a new conversation (its prompt extends no earlier sample)", "start"


def sample_view(
    sample: TrajectorySampleRecord,
    texts: Mapping[int, str],
    calls: Mapping[str, LlmCallRecord] | None = None,
) -> SampleView:
    """The sample's pieces; with the rollout's `calls` (by id), its segment and call marks."""
    ids = sample.response_ids[:MAX_TOKENS_SHOWN]
    marks = _marks(sample, calls or {})
    starts = dict(marks)
    pieces: list[Piece] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            label = f"ids {run[0]}…{run[-1]}" if len(run) > 1 else f"id {run[0]}"
            text = "".join(_text(texts, i) for i in run)
            pieces.append(Piece(text, False, f"{label} · not trained (mask 0)"))
            run.clear()

    for pos, token_id in enumerate(ids):
        mark = starts.get(pos)
        if mark is not None:
            flush()
            pieces.append(Piece("", False, mark.why, mark))
        mask = sample.loss_mask[pos] if pos < len(sample.loss_mask) else 0
        if not mask:
            run.append(token_id)
            continue
        flush()
        logprob = sample.logprobs[pos] if sample.logprobs and pos < len(sample.logprobs) else None
        shown = "n/a" if logprob is None else f"{logprob:.4f}"
        pieces.append(Piece(_text(texts, token_id), True, f"id {token_id} · logprob {shown}"))
    flush()
    segment, kind = segment_start(sample, marks[0][1] if marks else None)
    return SampleView(
        sample_index=sample.sample_index,
        builder=sample.builder,
        prompt_text="".join(_text(texts, i) for i in sample.prompt_ids),
        n_prompt=len(sample.prompt_ids),
        pieces=pieces,
        n_response=len(sample.response_ids),
        n_trained=sum(1 for m in sample.loss_mask if m),
        cut=len(sample.response_ids) > MAX_TOKENS_SHOWN,
        meta=sample.meta,
        calls=tuple(mark for _, mark in marks),
        segment=segment,
        segment_kind=kind,
    )


def trajectory_views(
    samples: Sequence[TrajectorySampleRecord],
    calls: Sequence[LlmCallRecord],
    decoder: TokenDecoder | None,
) -> list[SampleView]:
    """Every sample of a trajectory, its token ids turned into text, its segment marked."""
    ids = {i for s in samples for i in (*s.prompt_ids, *s.response_ids[:MAX_TOKENS_SHOWN])}
    texts = token_texts(decoder, calls, ids)
    by_id = {str(c.id): c for c in calls}
    return [sample_view(s, texts, by_id) for s in samples]
