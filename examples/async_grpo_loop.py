"""A simulated asynchronous GRPO training loop against a running polar_mq.

What a real trainer does, with the GPU work replaced by sleeps (see docs/async_rl.md):

1. submit one job of many tasks with `staleness: {max_staleness: S, batch_size: B}`: polar_mq
   generates at most S training steps' worth of groups ahead of the trainer;
2. take B complete groups at a time (`Client.stream_groups`, manual acks);
3. compute GRPO advantages per group: (reward - group mean) / (group std + 1e-6);
4. "train" (sleep --step-s), then acknowledge the batch (after the optimizer step: a crash
   before it means the groups are handed out again);
5. publish new weights: `set_policy(v + 1, pause=True)` (new LLM calls wait, in-flight ones
   drain), "load" them into the inference engines (sleep --load-s), `resume_policy()`.

It prints throughput per step and, at the end, how stale the consumed groups were (the
trainer's version when it took the group minus the oldest policy version among its tokens).

    # against a running stack (API URL and key from the flags or POLAR_MQ_API_URL/_API_KEY)
    .venv/bin/python examples/async_grpo_loop.py --tasks 32 --samples 4 --batch-size 4 \
        --max-staleness 1 --step-s 1.5
    # or start a throwaway local stack (SQLite, embedded broker, fake model) first
    .venv/bin/python examples/async_grpo_loop.py --local
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from polar_mq.client import Client, delivery_ids

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` small arithmetic questions with their answers (graded by `exact_match`)."""
    rng = random.Random(seed)
    tasks = []
    for _ in range(n):
        a, b, op = rng.randint(2, 40), rng.randint(2, 12), rng.choice(list(OPS))
        tasks.append({"instruction": f"What is {a} {op} {b}?", "answer": str(OPS[op](a, b))})
    return tasks


def grpo_advantages(group: Mapping[str, Any]) -> dict[str, float]:
    """rollout id -> (reward - mean) / (std + 1e-6), over the group's usable samples.

    Unusable samples (infrastructure failures: no reward) get no advantage and no gradient.
    """
    usable = [s for s in group["samples"] if s["usable"]]
    if not usable:
        return {}
    rewards = [float(s["reward"]) for s in usable]
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return {
        s["rollout_id"]: (r - mean) / (std + 1e-6) for s, r in zip(usable, rewards, strict=True)
    }


def oldest_version(group: Mapping[str, Any]) -> int | None:
    """The oldest policy version that produced any token of the group (what staleness is
    judged on); None when no sample has tokens."""
    versions = group.get("policy_versions")
    return int(versions["min"]) if versions else None


def train_loop(client: Client, args: argparse.Namespace) -> int:
    tasks = arithmetic_tasks(args.tasks, args.seed)
    version = int(client.policy()["version"])
    job = client.submit(
        tasks,
        samples_per_task=args.samples,
        harness={"type": "reference"},
        evaluator={"name": "exact_match", "extract": "last_number"},
        sampling={"temperature": 0.8, "max_tokens": 64},
        staleness={
            "max_staleness": args.max_staleness,
            "batch_size": args.batch_size,
            "on_stale": args.on_stale,
        },
        metadata={"example": "async_grpo_loop"},
    )
    print(
        f"job {job.job_id}: {len(tasks)} tasks x {args.samples} samples, batch {args.batch_size}"
        f" groups, max_staleness {args.max_staleness}, starting at policy version {version}"
    )
    staleness: Counter[int] = Counter()
    started = waited_from = time.perf_counter()
    groups_total = samples_total = 0
    batches = client.stream_groups(
        job.job_id, batch_size=args.batch_size, consumer=args.consumer, lease_s=args.lease_s,
        ack="manual",
    )  # fmt: skip
    for step, batch in enumerate(batches):
        got = time.perf_counter()
        wait_s = got - waited_from
        for group in batch:
            oldest = oldest_version(group)
            if oldest is not None:
                staleness[version - oldest] += 1
        advantages = [grpo_advantages(group) for group in batch]
        n_samples = sum(len(a) for a in advantages)
        rewards = [s["reward"] for g in batch for s in g["samples"] if s["usable"]]
        time.sleep(args.step_s)  # the optimizer step on `advantages` and the token arrays
        client.ack_groups(job.job_id, args.consumer, delivery_ids(batch))
        trained = time.perf_counter()
        update = client.set_policy(version + 1, pause=True, drain_timeout_s=args.drain_timeout_s)
        time.sleep(args.load_s)  # push the new weights into vLLM / SGLang here
        client.resume_policy()
        version += 1
        done = time.perf_counter()
        groups_total += len(batch)
        samples_total += n_samples
        step_s = done - waited_from
        mean_reward = statistics.fmean(rewards) if rewards else float("nan")
        print(
            f"step {step:3d} v{version - 1}->v{version}: {len(batch)} groups {n_samples} samples"
            f" | {len(batch) / step_s:5.2f} groups/s {n_samples / step_s:6.2f} samples/s"
            f" | step {step_s:5.2f}s waited {wait_s:5.2f}s train {trained - got:5.2f}s"
            f" update {done - trained:5.2f}s (drained {update['drained_calls']} calls"
            f" in {update['waited_s']:.2f}s)"
            f" | mean reward {mean_reward:.2f}"
        )
        waited_from = done
    wall = time.perf_counter() - started
    # too old for the trainer: kept out of the stream, still in the results for off-policy use
    stale = Counter(g["stale"] for g in client.results(job.job_id) if g.get("stale"))
    print(
        f"\n{groups_total} groups, {samples_total} samples in {wall:.1f}s: "
        f"{groups_total / wall:.2f} groups/s, {samples_total / wall:.2f} samples/s"
    )
    print(
        f"withheld or dropped as stale (see `stale` in the results): {sum(stale.values())}"
        f" {dict(stale)}"
    )
    print("staleness of consumed groups (version at consumption - oldest token version):")
    total = sum(staleness.values()) or 1
    for lag in sorted(staleness):
        bar = "#" * round(40 * staleness[lag] / total)
        print(f"  {lag:2d} | {bar} {staleness[lag]}")
    return 0


@contextlib.contextmanager
def local_stack() -> Iterator[str]:
    """A throwaway stack like `polar-mq demo --fake`: SQLite, embedded broker, fake model,
    proxy, API and one Celery worker per stage. Yields the API URL; removed after a clean run."""
    from polar_mq.config import Settings
    from polar_mq.infra.migrate import upgrade
    from polar_mq.infra.ports import free_port
    from polar_mq.lifecycle.stages import Stage
    from polar_mq.stack.devstack import LocalStack

    root = Path(tempfile.mkdtemp(prefix="polar-async-example-"))
    upstream = free_port()
    settings = Settings(
        database_url=f"sqlite:///{root / 'polar_mq.db'}",
        broker_url=f"sqla+sqlite:///{root / 'broker.db'}",
        proxy_port=free_port(),
        api_port=free_port(),
        upstream_url=f"http://127.0.0.1:{upstream}",
        served_model="fake-model",
        runtime_root=root / "runtimes",
        # like `polar-mq demo`: only the built-in reference agent, below a private (mkdtemp 0700)
        # directory, run as the user who started the example; real nodes use pool users
        unsafe_root_agents=True,
        node_name="example",
        pool="example",
    )
    upgrade(settings.database_url)
    print(f"starting a local stack in {root} (logs in {root / 'logs'}) …")
    with LocalStack(settings, root / "logs") as stack:
        stack.fake_upstream(upstream, ttft_ms=200)
        stack.proxy()
        stack.workers(concurrency={Stage.RUN_AGENT: 8})
        stack.sweeper()
        stack.api()
        yield f"http://{settings.api_host}:{settings.api_port}"
    shutil.rmtree(root, ignore_errors=True)  # kept (logs and database) when the loop failed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--api-url", default=os.environ.get("POLAR_MQ_API_URL", "http://127.0.0.1:8000"))
    p.add_argument("--api-key", default=os.environ.get("POLAR_MQ_API_KEY"))
    p.add_argument("--local", action="store_true", help="start a local stack with a fake model")
    p.add_argument("--tasks", type=int, default=24, help="arithmetic tasks (groups)")
    p.add_argument("--samples", type=int, default=4, help="samples per task (GRPO group size)")
    p.add_argument("--batch-size", type=int, default=4, help="groups per training step")
    p.add_argument("--max-staleness", type=int, default=1, help="policy versions a group may lag")
    p.add_argument(
        "--on-stale",
        choices=("withhold", "drop"),
        default="withhold",
        help="too-old groups: keep them in the results, or also cancel their unfinished rollouts",
    )
    p.add_argument("--step-s", type=float, default=1.0, help="simulated optimizer step")
    p.add_argument("--load-s", type=float, default=0.3, help="simulated weight load")
    p.add_argument("--drain-timeout-s", type=float, default=30.0)
    p.add_argument("--lease-s", type=float, default=300.0, help="lease of a batch being trained")
    p.add_argument("--consumer", default=f"grpo-example-{os.getpid()}")
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.local:
            # SIGTERM unwinds like Ctrl-C, so the stack's processes are stopped on the way out
            signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
            args.api_url = stack.enter_context(local_stack())
        client = stack.enter_context(Client(args.api_url, api_key=args.api_key))
        return train_loop(client, args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
