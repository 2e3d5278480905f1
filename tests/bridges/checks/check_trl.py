"""TRL's side of the TRL bridge contract, run in the trainers' venv (trl 1.16.0, torch, cpu).

    check_trl.py async GROUPS.json      real RolloutSamples through TRL's own queue dataset,
                                        planner and packing collator (AsyncGRPOTrainer's input)
    check_trl.py grpo URL MODEL OUT     one real GRPOTrainer step whose rollout_func runs a job
                                        on the polar_mq stack at URL
    check_trl.py worker URL             PolarMQRolloutWorker leasing a job's groups into
                                        TRL's queue dataset

Each asserts, then prints a JSON report as its last stdout line.
"""

from __future__ import annotations

import json
import math
import queue
import sys
from collections import Counter, defaultdict
from typing import Any

TASKS = [
    {"instruction": "What is 6*7?", "answer": "42"},
    {"instruction": "Compute 12+30.", "answer": "42"},
    {"instruction": "What is 100-1?", "answer": "98"},
]
JOB = {"harness": {"type": "reference"}, "evaluator": "exact_match", "timeouts": {"agent_s": 60}}


def through_trl_pipeline(samples: list[Any]) -> dict[str, Any]:
    """Feed samples to TRL's RolloutQueueDataset -> FixedCountBatcher -> DataCollatorForRollout,
    as AsyncGRPOTrainer.get_train_dataloader wires them (one process)."""
    from trl.experimental.async_grpo.async_grpo_trainer import (
        DataCollatorForRollout,
        FixedCountBatcher,
        RolloutQueueDataset,
    )

    buffer: queue.Queue[Any] = queue.Queue()
    for sample in samples:
        buffer.put(sample)
    metrics: dict[str, list[Any]] = defaultdict(list)
    dataset = RolloutQueueDataset(buffer, lambda: 0, lambda s: None, 60.0, metrics, max_staleness=3)
    rows = next(iter(FixedCountBatcher(dataset, num_processes=1, microbatch_size=len(samples))))
    batch: dict[str, Any] = DataCollatorForRollout(pad_token_id=0, num_processes=1)([rows])
    return batch


def check_async(path: str) -> dict[str, Any]:
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from polar_mq.bridges.samples import training_samples
    from polar_mq.bridges.trl import rollout_samples

    with open(path) as file:
        groups = json.load(file)
    rows = training_samples(groups)
    samples = rollout_samples(groups)
    assert len(samples) == len(rows) > 0
    for sample, row in zip(samples, rows, strict=True):
        assert isinstance(sample, RolloutSample)
        n = len(row.prompt_ids) + len(row.response_ids)
        assert sample.input_ids.dtype == np.int64 and sample.input_ids.shape == (n,)
        assert sample.completion_mask.dtype == np.int64 and sample.completion_mask.shape == (n,)
        assert sample.old_log_probs.dtype == np.float32 and sample.old_log_probs.shape == (n,)
        assert sample.input_ids.tolist() == row.prompt_ids + row.response_ids
        assert not sample.completion_mask[: len(row.prompt_ids)].any()
        assert sample.completion_mask[len(row.prompt_ids) :].tolist() == row.loss_mask
        assert np.allclose(sample.old_log_probs[len(row.prompt_ids) :], row.logprobs)
        assert sample.advantage == row.advantage and sample.model_version == 0
    assert sorted({s.group_id for s in samples}) == list(range(len(groups)))

    batch = through_trl_pipeline(samples)
    # every trained token of every sample is one loss term, predicted from the token before it,
    # with the engine's logprob and the sample's advantage attached
    trained = [
        (tok, lp, row.advantage)
        for row in rows
        for tok, m, lp in zip(row.response_ids, row.loss_mask, row.logprobs or [], strict=True)
        if m
    ]
    packed_targets = batch["shift_labels"][0][batch["token_index"][0]].tolist()  # row 0
    assert int(batch["global_n_tokens"][0]) == len(trained) == len(packed_targets)
    assert Counter(packed_targets) == Counter(t for t, _, _ in trained)
    assert sorted(batch["old_log_probs"][0].tolist()) == sorted(
        float(np.float32(lp)) for _, lp, _ in trained
    )
    assert sorted(batch["advantages"][0].tolist()) == sorted(
        float(np.float32(a)) for *_, a in trained
    )
    assert all(lp <= 0.0 for lp in batch["old_log_probs"][0].tolist())
    return {
        "samples": len(samples), "groups": len(groups), "trained_tokens": len(trained),
        "forward_tokens": int(batch["global_n_forward_tokens"][0]),
        "sample_tokens": sum(len(s.input_ids) for s in samples),
    }  # fmt: skip


def check_grpo(url: str, model: str, out: str) -> dict[str, Any]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from polar_mq.bridges.trl import make_rollout_func, polar_reward
    from polar_mq.client import Client

    answers = {t["instruction"]: t["answer"] for t in TASKS}
    seen: list[dict[str, Any]] = []
    with Client(url) as client:
        inner = make_rollout_func(
            client, {**JOB, "builder": "prefix_merge"},
            task_for_prompt=lambda p: {"instruction": p, "answer": answers[p]},
        )  # fmt: skip

        def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
            output = inner(prompts, trainer)
            seen.append({"prompts": list(prompts), **output})
            return output

        args = GRPOConfig(
            output_dir=out, use_cpu=True, per_device_train_batch_size=4, num_generations=2,
            max_steps=1, learning_rate=1e-4, beta=0.0, logging_steps=1, report_to="none",
            save_strategy="no", bf16=False, seed=0, shuffle_dataset=False,
            dataloader_num_workers=0,
        )  # fmt: skip
        # a right and a wrong answer: two groups of two, rewards 1 and 0
        dataset = Dataset.from_list([{"prompt": TASKS[i]["instruction"]} for i in (0, 2)])
        trainer = GRPOTrainer(
            model=model, reward_funcs=[polar_reward], args=args, train_dataset=dataset,
            rollout_func=rollout_func,
        )  # fmt: skip
        trainer.train()
    (call,) = seen
    n = len(call["prompts"])
    assert n == 4 and all(len(call[k]) == n for k in ("prompt_ids", "completion_ids", "logprobs"))
    for ids, mask, lps in zip(
        call["completion_ids"], call["env_mask"], call["logprobs"], strict=True
    ):
        assert len(ids) == len(mask) == len(lps)
    log = next(e for e in trainer.state.log_history if "reward" in e)
    rewards = call["polar_reward"]
    assert math.isclose(log["reward"], sum(rewards) / n, abs_tol=1e-6), (log, rewards)
    # TRL counts completion length over env_mask = 1 only: it read polar_mq's loss mask
    trained = [sum(m) for m in call["env_mask"]]
    assert math.isclose(log["completions/mean_length"], sum(trained) / n, abs_tol=1e-3), log
    assert sum(trained) < sum(len(c) for c in call["completion_ids"])  # tool output masked out
    # the scripted policy answers alike within a group: advantages 0, a finite (zero) loss
    assert math.isfinite(log.get("loss", 0.0))
    return {
        "completions": n, "reward": log["reward"], "rewards": rewards, "loss": log.get("loss"),
        "mean_trained_length": log["completions/mean_length"],
    }  # fmt: skip


def check_worker(url: str) -> dict[str, Any]:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from polar_mq.bridges.trl import PolarMQRolloutWorker
    from polar_mq.client import Client

    with Client(url) as client:
        job = client.submit(TASKS, samples_per_task=2, builder="prefix_merge", **JOB)
        worker = PolarMQRolloutWorker(client, job.job_id, groups_per_lease=2)
        worker.start()
        samples = [worker.rollout_buffer.get(timeout=240) for _ in range(6)]
        assert worker.finished.wait(120)
        try:
            worker.check_health(600)
            raise AssertionError("check_health passed on a finished job")
        except RuntimeError as exc:
            assert "no more groups" in str(exc)
        worker.update_model_version(1)
        version = client.policy()["version"]
        status = client.status(job.job_id)
        worker.stop()
    assert all(isinstance(s, RolloutSample) for s in samples)
    assert sorted(Counter(s.group_id for s in samples).values()) == [2, 2, 2]
    assert sorted({s.group_id for s in samples}) == [0, 1, 2]
    assert worker.rollout_buffer.empty() and worker.groups_done == 3
    batch = through_trl_pipeline(samples)
    return {
        "samples": len(samples), "policy_version": version, "base_version": worker.base_version,
        "trained_tokens": int(batch["global_n_tokens"][0]), "groups_total": status["groups_total"],
    }  # fmt: skip


def main() -> None:
    mode, *args = sys.argv[1:]
    checks = {"async": check_async, "grpo": check_grpo, "worker": check_worker}
    report = checks[mode](*args)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
