"""The learner process: a peft LoRA policy on PyTorch, driven one JSON line at a time.

Run in the vLLM venv (torch, transformers, peft live there) as `python -m
polar_mq.training.learner`, by `learner_client.Learner`. Each request on stdin is one JSON object
with an `op`; each answer on stdout is one JSON object (`{"error": ...}` when the op failed).
Anything libraries print goes to stderr, so stdout carries answers only.

Ops: `init` (load the model, wrap it in a LoRA whose B is zero: the policy equals the engine's
base weights), `step` (one optimizer step on GRPO samples; answers the loss and the
trainer-engine logprob mismatch measured on the weights before the step), `save` (peft
`save_pretrained` into a directory the engines can read), `logprobs` (the policy's logprobs of a
response, for checks), `plot` (the reward curve, `plot.py`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, TextIO, TypeVar

import torch

from polar_mq.training.torch_ops import (
    Scored,
    clipped_fraction,
    grouped_response_logprobs,
    grpo_loss,
    kl_to_reference,
    mismatch,
    response_logprobs,
)

T = TypeVar("T")
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""Every projection of a Llama block: what vLLM's LoRA serves for SmolLM2."""


def chunks(items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class Policy:
    def __init__(self, request: dict[str, Any]) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(int(request.get("seed", 0)))
        torch.set_num_threads(int(request.get("threads", 2)))
        base = AutoModelForCausalLM.from_pretrained(request["model_dir"], dtype=torch.float32)
        rank = int(request.get("rank", 8))
        config = LoraConfig(
            r=rank,
            lora_alpha=int(request.get("alpha", 2 * rank)),
            target_modules=TARGET_MODULES,
            lora_dropout=0.0,
        )  # peft's default init: A random, B zero, so the adapter adds nothing at step 0
        self.model = get_peft_model(base, config)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=float(request.get("lr", 1e-4)))
        self.trainable = sum(p.numel() for p in params)
        self.max_grad_norm = float(request.get("max_grad_norm", 1.0))
        self.micro_batch = int(request.get("micro_batch", 8))
        """Sequences per forward pass (padded to the longest); the samples of a group come in
        order and share their prompt, which then runs once per micro-batch (`torch_ops`)."""
        eos = base.config.eos_token_id
        self.pad_id = int((eos[0] if isinstance(eos, list) else eos) or 0)
        """Any id does (masked out, and after every real token); the end-of-text one is safe."""

    def step(self, request: dict[str, Any]) -> dict[str, Any]:
        """One optimizer step on GRPO samples: the clipped importance-sampled loss over the
        samples to train on (`train`, averaged over their loss-mask tokens), minus
        `entropy_coef` times the policy's mean entropy over every sample's loss-mask tokens
        (groups without signal included: where the policy narrowed to one reply is where the
        bonus is wanted). Without the bonus, the samples not trained on are only scored, for the
        mismatch figure."""
        clip = float(request.get("clip", 0.2))
        temperature = float(request.get("temperature", 1.0))  # the rollouts' (`torch_ops`)
        entropy_coef = float(request.get("entropy_coef", 0.0))
        kl_coef = float(request.get("kl_coef", 0.0))
        samples = request["samples"]
        total = sum(sum(s["loss_mask"]) for s in samples if s.get("train", True))
        masked = sum(sum(s["loss_mask"]) for s in samples)
        bonus = entropy_coef > 0 and masked > 0
        graded = [bool(total) and s.get("train", True) for s in samples]
        needs_grad = [bonus or g for g in graded]
        self.optimizer.zero_grad(set_to_none=True)
        pairs, entropies, kls, loss_sum, clipped = [], [], [], 0.0, 0
        scored_only = [s for s, g in zip(samples, needs_grad, strict=True) if not g]
        with torch.no_grad():
            scores = self.logprobs_of(scored_only, temperature)
            for sample, scored in zip(scored_only, scores, strict=True):
                old, mask = self.arrays(sample)
                pairs.append((scored.logprobs, old, mask))
                entropies.append(scored.entropy[mask.bool()])
        stepped = [(s, g) for s, g, n in zip(samples, graded, needs_grad, strict=True) if n]
        anchored = sum(sum(s["loss_mask"]) for s, _ in stepped) if kl_coef > 0 else 0
        for chunk in chunks(stepped, self.micro_batch):  # one backward per micro-batch
            loss = torch.zeros(())
            scores = self.logprobs_of([sample for sample, _ in chunk], temperature)
            refs = self.reference_logprobs([s for s, _ in chunk], temperature, bool(anchored))
            for (sample, trains), scored, ref in zip(chunk, scores, refs, strict=True):
                old, mask = self.arrays(sample)
                new = scored.logprobs
                pairs.append((new.detach(), old, mask))
                entropies.append(scored.entropy.detach()[mask.bool()])
                if trains:
                    advantage = float(sample["advantage"])
                    loss = loss + grpo_loss(new, old, mask, advantage, clip) / total
                    clipped += clipped_fraction(new, old, mask, clip)
                if bonus:
                    loss = loss - entropy_coef * (scored.entropy * mask).sum() / masked
                if ref is not None:
                    kl = kl_to_reference(new, ref, mask)
                    kls.append(float(kl.detach()))
                    loss = loss + kl_coef * kl / anchored
            loss.backward()
            loss_sum += float(loss.detach())
        norm = None
        if total > 0 or bonus:
            params = [p for p in self.model.parameters() if p.requires_grad]
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
            self.optimizer.step()
        gap = mismatch(pairs)  # on the weights before the step: the ones that were published
        every = torch.cat(entropies) if entropies else torch.zeros(0)
        return {
            "tokens": total,
            "loss": loss_sum,
            "grad_norm": norm,
            "clipped_tokens": clipped,
            "mismatch_mean": gap.mean if gap.tokens else None,
            "mismatch_max": gap.max if gap.tokens else None,
            "mismatch_tokens": gap.tokens,
            "entropy_mean": float(every.mean()) if every.numel() else None,
            "kl_mean": sum(kls) / anchored if anchored else None,
        }

    def reference_logprobs(
        self, samples: list[dict[str, Any]], temperature: float, wanted: bool
    ) -> list[torch.Tensor | None]:
        """The base model's logprobs of the samples (the adapter off, no gradient), or Nones."""
        if not wanted:
            return [None] * len(samples)
        with torch.no_grad(), self.model.disable_adapter():
            return [scored.logprobs for scored in self.logprobs_of(samples, temperature)]

    def logprobs_of(self, samples: list[dict[str, Any]], temperature: float) -> list[Scored]:
        """The samples scored at `temperature`, one forward pass per micro-batch."""
        pairs = [(s["prompt_ids"], s["response_ids"]) for s in samples]
        return [
            scored
            for part in chunks(pairs, self.micro_batch)
            for scored in grouped_response_logprobs(self.model, part, self.pad_id, temperature)
        ]

    @staticmethod
    def arrays(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's logprobs and the loss mask of a sample, as tensors."""
        old = torch.tensor(sample["logprobs"], dtype=torch.float32)
        return old, torch.tensor(sample["loss_mask"], dtype=torch.float32)

    def save(self, folder: str) -> dict[str, Any]:
        self.model.save_pretrained(folder)
        return {"path": folder}

    def logprobs(self, request: dict[str, Any]) -> dict[str, Any]:
        with torch.no_grad():
            values = response_logprobs(
                self.model,
                request["prompt_ids"],
                request["response_ids"],
                float(request.get("temperature", 1.0)),
            )
        return {"logprobs": values.tolist()}


def handle(policy: Policy | None, request: dict[str, Any]) -> tuple[Policy | None, dict[str, Any]]:
    op = request.get("op")
    if op == "init":
        policy = Policy(request)
        return policy, {"trainable": policy.trainable}
    if op == "plot":
        from polar_mq.training.plot import plot_curve

        plot_curve(request["json"], request["png"])
        return policy, {"png": request["png"]}
    if policy is None:
        return policy, {"error": f"op {op!r} before init"}
    if op == "step":
        return policy, policy.step(request)
    if op == "save":
        return policy, policy.save(request["dir"])
    if op == "logprobs":
        return policy, policy.logprobs(request)
    return policy, {"error": f"unknown op {op!r}"}


def serve(requests: TextIO, answers: TextIO) -> None:
    policy: Policy | None = None
    for line in requests:
        if not line.strip():
            continue
        try:
            policy, answer = handle(policy, json.loads(line))
        except Exception as exc:  # the loop reports it; the learner stays up
            traceback.print_exc(file=sys.stderr)
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main() -> int:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # library prints cannot corrupt answers
    sys.stdout = sys.stderr
    serve(sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
