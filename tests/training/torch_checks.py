"""Figures of the learner's torch code, computed in the vLLM venv (which has torch and peft) and
printed as one JSON object for `test_torch_ops.py`, which asserts on them.

    $VLLM_PYTHON tests/training/torch_checks.py MODEL_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from polar_mq.training.learner import Policy
from polar_mq.training.torch_ops import (
    batch_response_logprobs,
    grouped_response_logprobs,
    grpo_loss,
    kl_to_reference,
    mismatch,
    response_logprobs,
)


def loss_figures() -> dict[str, object]:
    """The clipped loss and its gradient at a few ratios, one token, advantage +-1."""
    out: dict[str, object] = {}
    for advantage in (1.0, -1.0):
        for ratio in (0.5, 1.0, 1.1, 1.5):
            new = torch.tensor([float(torch.log(torch.tensor(ratio)))], requires_grad=True)
            loss = grpo_loss(new, torch.zeros(1), torch.ones(1), advantage, clip=0.2)
            loss.backward()
            out[f"{advantage:+.0f}@{ratio}"] = [float(loss), float(new.grad[0])]
    masked = grpo_loss(torch.zeros(3), torch.zeros(3), torch.tensor([1.0, 0.0, 1.0]), 2.0, 0.2)
    out["masked_sum"] = float(masked)
    trained = torch.tensor([1.0, 0.0, 1.0])
    gap = mismatch([(torch.tensor([0.0, 5.0, -1.0]), torch.zeros(3), trained)])
    out["mismatch_masked"] = [gap.mean, gap.max, gap.tokens]
    # k3 at gaps 0, 1 and 30 nats (the policy far under the reference), one masked token
    new = torch.tensor([0.0, -1.0, -30.0, -30.0], requires_grad=True)
    kl = kl_to_reference(new, torch.zeros(4), torch.tensor([1.0, 1.0, 1.0, 0.0]))
    kl.backward()
    out["kl_bounded"] = [float(kl), *[float(g) for g in new.grad]]
    return out


def offset_figures(model_dir: str) -> dict[str, object]:
    """Greedy generation's own scores against the recomputation, right and off by one, and a
    zero-B LoRA policy against the base model (the step-0 claim)."""
    policy = Policy({"model_dir": model_dir, "seed": 0, "threads": 2, "rank": 8, "lr": 1e-3})
    model = policy.model
    model.eval()
    prompt = [1, 9690, 198, 2683, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
    with torch.no_grad():
        generated = model.generate(
            input_ids=torch.tensor([prompt]), do_sample=False, max_new_tokens=8,
            output_scores=True, return_dict_in_generate=True, pad_token_id=0,
        )  # fmt: skip
        response = generated.sequences[0, len(prompt) :].tolist()
        scores = zip(generated.scores, response, strict=True)
        engine = torch.stack([F.log_softmax(s[0].float(), -1)[t] for s, t in scores])
        right = response_logprobs(model, prompt, response)
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
        shifted = F.log_softmax(logits[len(prompt) : len(prompt) + len(response)], -1)
        wrong = shifted.gather(1, torch.tensor(response)[:, None])[:, 0]
        with model.disable_adapter():
            base = response_logprobs(model, prompt, response)
        both = [(prompt, response), (prompt[:5], response[:3])]
        batched = [scored.logprobs for scored in batch_response_logprobs(model, both)]
        single = response_logprobs(model, prompt[:5], response[:3])
    mask = torch.ones(len(response))
    before = right.clone()
    # one step that pushes the generated reply up: the policy must move
    sample = {"prompt_ids": prompt, "response_ids": response, "loss_mask": [1] * len(response),
              "logprobs": right.tolist(), "advantage": 1.0}  # fmt: skip
    model.train()
    step = policy.step({"samples": [sample], "clip": 0.2})
    with torch.no_grad():
        after = response_logprobs(model, prompt, response)
    return {
        "tokens": len(response),
        "right": mismatch([(right, engine, mask)]).max,
        "shifted": mismatch([(wrong, engine, mask)]).mean,
        "batched_vs_single": max(
            float((batched[0] - right).abs().max()), float((batched[1] - single).abs().max())
        ),
        "zero_lora_vs_base": float((right - base).abs().max()),
        "step_mismatch_max": step["mismatch_max"],
        "step_tokens": step["tokens"],
        "moved_up": float((after - before).sum()),
    }


def shared_prompt_figures(model_dir: str) -> dict[str, float]:
    """Samples that share a prompt, scored with the prompt run once (`grouped_response_logprobs`)
    against one pass per sample: the logprobs and the LoRA gradient of a weighted sum of them."""
    policy = Policy({"model_dir": model_dir, "seed": 0, "threads": 1, "rank": 8, "lr": 1e-3})
    model = policy.model
    for name, param in model.named_parameters():
        if "lora_B" in name:  # a LoRA that changes the model, so its gradient path is exercised
            param.data.normal_(0.0, 0.02)
    a, b = list(range(100, 130)), list(range(300, 321))
    pairs = [(a, [5, 6, 7]), (a, [8]), (b, [9, 10, 11, 12]), (a, [14, 15, 16, 17, 18]), (b, [20])]
    params = [p for p in model.parameters() if p.requires_grad]

    def gradient(values: list[torch.Tensor]) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        sum((v * (i + 1)).sum() for i, v in enumerate(values)).backward()
        return torch.cat([p.grad.flatten() for p in params if p.grad is not None])

    grouped = [scored.logprobs for scored in grouped_response_logprobs(model, pairs, pad_id=2)]
    grouped_grad = gradient(grouped)
    single = [response_logprobs(model, prompt, response) for prompt, response in pairs]
    single_grad = gradient(single)
    return {
        "lengths_match": float([len(v) for v in grouped] == [len(r) for _, r in pairs]),
        "values": max(float((g - s).abs().max()) for g, s in zip(grouped, single, strict=True)),
        "gradient": float((grouped_grad - single_grad).norm() / single_grad.norm()),
    }


def tempered_figures(model_dir: str) -> dict[str, float]:
    """Logprobs scored at a sampling temperature: `log_softmax(logits / T)` on every path (one
    pass, batched, shared prompt), far from the untempered ones, and a learner step told the
    rollouts' temperature measures no gap against logprobs of that same distribution."""
    policy = Policy({"model_dir": model_dir, "seed": 0, "threads": 1, "rank": 8, "lr": 1e-3})
    model = policy.model
    model.eval()
    t = 1.5
    a = list(range(100, 130))
    pairs = [(a, [5, 6, 7]), (a, [8, 9]), (list(range(300, 321)), [20, 21])]
    with torch.no_grad():
        manual = []
        for prompt, response in pairs:
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
            scoring = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)] / t
            targets = torch.tensor(response)[:, None]
            manual.append(F.log_softmax(scoring, -1).gather(1, targets)[:, 0])
        grouped = [x.logprobs for x in grouped_response_logprobs(model, pairs, 2, temperature=t)]
        single = [response_logprobs(model, p, r, temperature=t) for p, r in pairs]
        plain = [x.logprobs for x in grouped_response_logprobs(model, pairs, pad_id=2)]
    model.train()
    samples = [{"prompt_ids": p, "response_ids": r, "loss_mask": [1] * len(r),
                "logprobs": m.tolist(), "advantage": 1.0 - i}
               for i, ((p, r), m) in enumerate(zip(pairs, manual, strict=True))]  # fmt: skip
    at_t = policy.step({"samples": samples, "clip": 0.2, "temperature": t})

    def gaps(values: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([(v - m).abs() for v, m in zip(values, manual, strict=True)])

    return {
        "grouped_vs_manual": float(gaps(grouped).max()),
        "single_vs_manual": float(gaps(single).max()),
        "untempered_gap": float(gaps(plain).mean()),
        "step_mismatch_max": at_t["mismatch_max"],
    }


def entropy_figures(model_dir: str) -> dict[str, object]:
    """The entropy figure against torch's own, and the entropy bonus: samples of a group
    without signal (`train: False`) are only scored without it, and with it the step raises
    the policy's entropy where they were sampled."""
    pairs = [(list(range(100, 130)), [5, 6, 7]), (list(range(100, 130)), [8, 9])]

    def policy_and_entropy() -> tuple[Policy, torch.Tensor]:
        policy = Policy({"model_dir": model_dir, "seed": 0, "threads": 1, "rank": 8, "lr": 1e-2})
        with torch.no_grad():
            scored = grouped_response_logprobs(policy.model, pairs, pad_id=2)
        return policy, torch.cat([x.entropy for x in scored])

    policy, before = policy_and_entropy()
    with torch.no_grad():
        torch_entropy = []
        for prompt, response in pairs:
            logits = policy.model(input_ids=torch.tensor([prompt + response])).logits[0].float()
            scoring = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
            torch_entropy.append(torch.distributions.Categorical(logits=scoring).entropy())
    samples = [{"prompt_ids": p, "response_ids": r, "loss_mask": [1] * len(r),
                "logprobs": [0.0] * len(r), "advantage": 0.0, "train": False}
               for p, r in pairs]  # fmt: skip
    plain = policy.step({"samples": samples, "clip": 0.2})
    _, unmoved = policy_and_entropy()
    policy, _ = policy_and_entropy()
    figures = [policy.step({"samples": samples, "clip": 0.2, "entropy_coef": 0.1})]
    figures += [policy.step({"samples": samples, "clip": 0.2, "entropy_coef": 0.1})]
    with torch.no_grad():
        after = torch.cat([x.entropy for x in grouped_response_logprobs(policy.model, pairs, 2)])
    return {
        "vs_torch": float((before - torch.cat(torch_entropy)).abs().max()),
        "logged": figures[0]["entropy_mean"],
        "mean_before": float(before.mean()),
        "plain_grad_norm": plain["grad_norm"],
        "plain_moved": float((unmoved - before).abs().max()),
        "bonus_grad_norm": figures[0]["grad_norm"],
        "raised": float(after.mean() - before.mean()),
    }


def kl_figures(model_dir: str) -> dict[str, object]:
    """The KL anchor: zero at step 0 (the adapter adds nothing), the logged figure equal to the
    KL computed directly, and a policy stepped with `kl_coef` 1 stays nearer the base
    weights than one stepped on the same samples without it."""
    pairs = [(list(range(100, 130)), [5, 6, 7]), (list(range(100, 130)), [8, 9, 10])]

    def make() -> Policy:
        return Policy({"model_dir": model_dir, "seed": 0, "threads": 1, "rank": 8, "lr": 1e-3})

    def kl_to_base(policy: Policy) -> float:
        with torch.no_grad():
            new = grouped_response_logprobs(policy.model, pairs, 2)
            with policy.model.disable_adapter():
                ref = grouped_response_logprobs(policy.model, pairs, 2)
        total = sum(
            float(kl_to_reference(n.logprobs, r.logprobs, torch.ones(len(n.logprobs))))
            for n, r in zip(new, ref, strict=True)
        )
        return total / sum(len(r) for _, r in pairs)

    def steps(kl_coef: float) -> tuple[Policy, list[dict[str, object]]]:
        policy = make()
        with torch.no_grad():
            old = [x.logprobs.tolist() for x in grouped_response_logprobs(policy.model, pairs, 2)]
        samples = [{"prompt_ids": p, "response_ids": r, "loss_mask": [1] * len(r),
                    "logprobs": o, "advantage": a, "train": True}
                   for (p, r), o, a in zip(pairs, old, (1.0, -1.0), strict=True)]  # fmt: skip
        answers = []
        for _ in range(4):
            before = kl_to_base(policy)
            answer = policy.step({"samples": samples, "clip": 10.0, "kl_coef": kl_coef})
            answers.append({**answer, "direct": before})
        return policy, answers

    plain, plain_steps = steps(0.0)
    anchored, anchored_steps = steps(1.0)
    return {
        "step0_logged": anchored_steps[0]["kl_mean"],
        "logged_vs_direct": max(
            abs(float(a["kl_mean"]) - float(a["direct"]))
            for a in anchored_steps  # type: ignore[arg-type]
        ),
        "plain_logged": plain_steps[-1]["kl_mean"],
        "plain": kl_to_base(plain),
        "anchored": kl_to_base(anchored),
    }


if __name__ == "__main__":
    print(
        json.dumps(
            {
                "loss": loss_figures(),
                "offsets": offset_figures(sys.argv[1]),
                "shared": shared_prompt_figures(sys.argv[1]),
                "tempered": tempered_figures(sys.argv[1]),
                "entropy": entropy_figures(sys.argv[1]),
                "kl": kl_figures(sys.argv[1]),
            }
        )
    )
