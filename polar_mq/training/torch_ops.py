"""The torch side of a GRPO step: the policy's logprobs on stored ids, the loss, the mismatch.

Imported only in the learner's interpreter (the vLLM venv, which has torch); the project venv
never imports this module.

Offsets: a causal LM's logits at position t predict token t+1, so over `prompt + response` the
response token i is scored by the logits at `len(prompt) + i - 1`. Getting this wrong by one is
the classic silent bug of trainers; it shows as a large trainer-engine mismatch, which is why the
loop logs that figure every step.

Temperature: a reply sampled at temperature T came from softmax(logits / T), and the engine
reports that distribution's logprobs when it runs with `--logprobs-mode processed_logprobs`.
The trainer scores the same distribution (`temperature`), or the importance ratio compares two
different policies (the untempered one is what vLLM's default `raw_logprobs` reports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F


class Scored(NamedTuple):
    """A response scored by the policy, one value per response token."""

    logprobs: torch.Tensor
    """log p(response_i | prompt, response_<i)."""
    entropy: torch.Tensor
    """The entropy of the policy's whole next-token distribution where response_i was sampled:
    how wide the policy still samples (it falls as the policy narrows to one reply)."""


def score_tokens(scoring: torch.Tensor, response: list[int], temperature: float) -> Scored:
    """Row i of `scoring` holds the logits that score response token i; both figures are of
    softmax(scoring / temperature)."""
    if temperature != 1.0:
        scoring = scoring / temperature
    targets = torch.tensor(response, dtype=torch.long)
    logp = F.log_softmax(scoring.float(), dim=-1)
    return Scored(logp.gather(1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1))


def response_logprobs(
    model: Any, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """log p(response_i | prompt, response_<i) under `model`, one per response token."""
    ids = torch.tensor([prompt_ids + response_ids], dtype=torch.long)
    logits = model(input_ids=ids).logits[0].float()
    start = len(prompt_ids) - 1
    scoring = logits[start : start + len(response_ids)]
    return score_tokens(scoring, response_ids, temperature).logprobs


def batch_response_logprobs(
    model: Any,
    pairs: list[tuple[list[int], list[int]]],
    pad_id: int = 0,
    temperature: float = 1.0,
) -> list[Scored]:
    """`response_logprobs` of several (prompt, response) pairs in one forward pass.

    Right-padded with an attention mask: a causal model's logits at the real positions do not
    see the padding after them, and the positions count from 0 as in a single pass. Logits are
    computed only from the first position that scores a response token on (`logits_to_keep`):
    the vocabulary projection of the prompt positions is wasted work, forward and backward."""
    if not pairs:
        return []
    lengths = [len(p) + len(r) for p, r in pairs]
    width = max(lengths)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, ((prompt, response), n) in enumerate(zip(pairs, lengths, strict=True)):
        ids[row, :n] = torch.tensor(prompt + response, dtype=torch.long)
        attention[row, :n] = 1
    first = min(len(prompt) for prompt, _ in pairs) - 1  # the first position that scores
    keep = width - first  # the lm head (a 49k-word matmul) runs on response positions only
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep).logits
    out = []
    for row, (prompt, response) in enumerate(pairs):
        start = len(prompt) - 1 - first
        scoring = logits[row, start : start + len(response)]
        out.append(score_tokens(scoring, response, temperature))
    return out


def shared_prompt_logprobs(
    model: Any,
    prompt: list[int],
    responses: list[list[int]],
    pad_id: int = 0,
    temperature: float = 1.0,
) -> list[Scored]:
    """`response_logprobs` of several responses to one prompt, running the prompt once.

    The samples of a GRPO group share their prompt, which is most of each sequence here: the
    prompt goes through the model once (its keys and values kept, with their gradient), is
    repeated for every response, and the responses run on top of it, right-padded. The values
    and the gradient are those of one pass per sample; the prompt's share of the work is paid
    once per group instead of once per sample."""
    if not responses:
        return []
    head = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=True,
                 logits_to_keep=1)  # fmt: skip
    first = head.logits[0, -1].float()  # scores every response's first token
    cache = head.past_key_values
    cache.batch_repeat_interleave(len(responses))
    width = max(1, max(len(r) for r in responses))
    ids = torch.full((len(responses), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(responses), len(prompt) + width), dtype=torch.long)
    attention[:, : len(prompt)] = 1
    for row, response in enumerate(responses):
        ids[row, : len(response)] = torch.tensor(response, dtype=torch.long)
        attention[row, len(prompt) : len(prompt) + len(response)] = 1
    positions = torch.arange(len(prompt), len(prompt) + width).expand(len(responses), width)
    logits = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache
    ).logits
    out = []
    for row, response in enumerate(responses):
        scoring = torch.cat([first[None], logits[row, : len(response) - 1].float()])
        out.append(score_tokens(scoring[: len(response)], response, temperature))
    return out


def grouped_response_logprobs(
    model: Any,
    pairs: list[tuple[list[int], list[int]]],
    pad_id: int = 0,
    temperature: float = 1.0,
) -> list[Scored]:
    """`response_logprobs` of (prompt, response) pairs, in order: pairs that share a prompt go
    through `shared_prompt_logprobs` together, the others through `batch_response_logprobs`."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for index, (prompt, _) in enumerate(pairs):
        by_prompt.setdefault(tuple(prompt), []).append(index)
    out: list[Scored | None] = [None] * len(pairs)
    singles = [indices[0] for indices in by_prompt.values() if len(indices) == 1]
    for index, value in zip(
        singles,
        batch_response_logprobs(model, [pairs[i] for i in singles], pad_id, temperature),
        strict=True,
    ):
        out[index] = value
    for shared, indices in by_prompt.items():
        if len(indices) > 1:
            values = shared_prompt_logprobs(
                model, list(shared), [pairs[i][1] for i in indices], pad_id, temperature
            )
            for index, value in zip(indices, values, strict=True):
                out[index] = value
    return [value for value in out if value is not None]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """|trainer logprob - engine logprob| over the trained (mask 1) tokens."""

    mean: float
    max: float
    tokens: int


def mismatch(pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Mismatch:
    """Over (trainer logprobs, engine logprobs, mask) per sample."""
    gaps = [(new.detach() - old).abs()[mask.bool()] for new, old, mask in pairs]
    every = torch.cat(gaps) if gaps else torch.zeros(0)
    if every.numel() == 0:
        return Mismatch(0.0, 0.0, 0)
    return Mismatch(float(every.mean()), float(every.max()), int(every.numel()))


def grpo_loss(
    new: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, advantage: float, clip: float
) -> torch.Tensor:
    """The clipped importance-sampled policy-gradient loss of one sample, summed over its
    trained tokens (the caller divides by the batch's trained tokens).

    `old` are the engine's logprobs (the behaviour policy that sampled the tokens): the ratio
    new/old corrects for the trainer's weights having moved (staleness) and for the engine's
    numerics differing from the trainer's; clipping it to [1 - clip, 1 + clip] bounds the step
    (PPO's pessimistic minimum)."""
    ratio = torch.exp(new - old)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantage
    per_token = -torch.minimum(unclipped, clipped)
    return (per_token * mask).sum()


def clipped_fraction(new: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, clip: float) -> int:
    """How many trained tokens had their ratio outside the clip range."""
    ratio = torch.exp(new.detach() - old)
    outside = (ratio < 1.0 - clip) | (ratio > 1.0 + clip)
    return int((outside & mask.bool()).sum())


KL_SLOPE_BOUND = 10.0
"""The most one token's KL term moves with its logprob: k3's slope at a gap of ln(11) nats."""
_KL_KNEE = math.log1p(KL_SLOPE_BOUND)


def kl_to_reference(new: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(policy || reference) at a sample's trained tokens, summed: Schulman's k3 estimator
    `exp(ref - new) - (ref - new) - 1`, non-negative per token and unbiased for tokens the
    policy sampled; its gradient pulls the policy's logprobs back toward the reference's.

    Past the knee (the policy `ln(1 + KL_SLOPE_BOUND)` nats under the reference) a token's term
    follows k3's tangent instead: still growing, still pulling the token back, at a bounded rate.
    Unbounded, k3 and its slope grow as `exp(ref - new)`: one stale sample whose token the
    policy has since pushed far under the reference gives a term in the thousands, its gradient
    swamps the step's (clipping the norm keeps only its direction), and the step lurches back
    toward the reference on that token alone. Clamping the term's value instead (verl's
    `low_var_kl` holds it at 10) would drop exactly those tokens' pull: the anchor would let go
    of the tokens that left the base the farthest.
    """
    gap = ref - new
    inside = torch.clamp(gap, max=_KL_KNEE)
    k3 = torch.exp(inside) - inside - 1.0
    tangent = KL_SLOPE_BOUND * torch.clamp(gap - _KL_KNEE, min=0.0)
    return ((k3 + tangent) * mask).sum()
