"""A trajectory as a person reads it: text, trained tokens highlighted, logprobs on hover.

Each training sample becomes its prompt (decoded, shown folded) and its response as a list of
token pieces. Consecutive tokens with the same loss mask and no logprob to show are merged into
one piece, so a long tool output is one element on the page; a trained token (mask 1) stays its
own piece so hovering shows its logprob.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polar_mq.jobs.read_models import LlmCallRecord, TrajectorySampleRecord
from polar_mq.ui.tokens_text import TokenDecoder, token_texts

MAX_TOKENS_SHOWN = 20_000
"""Per sample: a longer response is cut (the page says so) to keep the page light."""


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    trained: bool
    title: str
    """Token id(s) and logprob, shown on hover."""


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


def _text(texts: Mapping[int, str], token_id: int) -> str:
    return texts.get(token_id, f"⟨{token_id}⟩")


def sample_view(sample: TrajectorySampleRecord, texts: Mapping[int, str]) -> SampleView:
    ids = sample.response_ids[:MAX_TOKENS_SHOWN]
    pieces: list[Piece] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            label = f"ids {run[0]}…{run[-1]}" if len(run) > 1 else f"id {run[0]}"
            text = "".join(_text(texts, i) for i in run)
            pieces.append(Piece(text, False, f"{label} · not trained (mask 0)"))
            run.clear()

    for pos, token_id in enumerate(ids):
        mask = sample.loss_mask[pos] if pos < len(sample.loss_mask) else 0
        if not mask:
            run.append(token_id)
            continue
        flush()
        logprob = sample.logprobs[pos] if sample.logprobs and pos < len(sample.logprobs) else None
        shown = "n/a" if logprob is None else f"{logprob:.4f}"
        pieces.append(Piece(_text(texts, token_id), True, f"id {token_id} · logprob {shown}"))
    flush()
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
    )


def trajectory_views(
    samples: Sequence[TrajectorySampleRecord],
    calls: Sequence[LlmCallRecord],
    decoder: TokenDecoder | None,
) -> list[SampleView]:
    """Every sample of a trajectory, its token ids turned into text."""
    ids = {i for s in samples for i in (*s.prompt_ids, *s.response_ids[:MAX_TOKENS_SHOWN])}
    texts = token_texts(decoder, calls, ids)
    return [sample_view(s, texts) for s in samples]
