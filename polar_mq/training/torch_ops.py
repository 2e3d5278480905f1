"""The torch side of a GRPO step: the policy's logprobs on stored ids, the loss, the mismatch.

Imported only in the learner's interpreter (the vLLM venv, which has torch); the project venv
never imports this module.

Offsets: a causal LM's logits at position t predict token t+1, so over `prompt + response` the
response token i is scored by the logits at `len(prompt) + i - 1`. Getting this wrong by one is
the classic silent bug of trainers; it shows as a large trainer-engine mismatch, which is why the
loop logs that figure every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def response_logprobs(model: Any, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    """log p(response_i | prompt, response_<i) under `model`, one per response token."""
    ids = torch.tensor([prompt_ids + response_ids], dtype=torch.long)
    logits = model(input_ids=ids).logits[0].float()
    start = len(prompt_ids) - 1
    scoring = logits[start : start + len(response_ids)]
    targets = torch.tensor(response_ids, dtype=torch.long)
    return F.log_softmax(scoring, dim=-1).gather(1, targets[:, None])[:, 0]


def batch_response_logprobs(
    model: Any, pairs: list[tuple[list[int], list[int]]], pad_id: int = 0
) -> list[torch.Tensor]:
    """`response_logprobs` of several (prompt, response) pairs in one forward pass.

    Right-padded with an attention mask: a causal model's logits at the real positions do not
    see the padding after them, and the positions count from 0 as in a single pass."""
    if not pairs:
        return []
    lengths = [len(p) + len(r) for p, r in pairs]
    width = max(lengths)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, ((prompt, response), n) in enumerate(zip(pairs, lengths, strict=True)):
        ids[row, :n] = torch.tensor(prompt + response, dtype=torch.long)
        attention[row, :n] = 1
    logits = model(input_ids=ids, attention_mask=attention).logits
    out = []
    for row, (prompt, response) in enumerate(pairs):
        start = len(prompt) - 1
        scoring = logits[row, start : start + len(response)].float()
        targets = torch.tensor(response, dtype=torch.long)
        out.append(F.log_softmax(scoring, dim=-1).gather(1, targets[:, None])[:, 0])
    return out


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
