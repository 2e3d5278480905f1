"""Streaming groups to trainers across a consumer crash, with real workers and the fake upstream.

A job of 6 tasks x 2 samples runs through the real four-stage pipeline. Trainer A (a real
subprocess using `AsyncClient.stream_groups`) takes its first batch and is SIGKILLed without
acking it. Trainer B, started right after, receives every group: the four A never saw once, and
A's two again after A's lease expired (delivery count 2). In the database every group ends acked
exactly once, by B: no group lost, none acknowledged twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import Client
from polar_mq.models import GroupDelivery
from polar_mq.stack.devstack import LocalStack

pytestmark = pytest.mark.e2e

CONSUMER = Path(__file__).with_name("stream_consumer.py")
ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 2.0


def start_consumer(
    url: str, job_id: str, name: str, out: Path, **extra: Any
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, str(CONSUMER), "--url", url, "--job", job_id, "--consumer", name,
        "--out", str(out), "--batch-size", "2", "--lease-s", str(LEASE_S),
    ]  # fmt: skip
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, env=env, cwd=ROOT, stderr=subprocess.PIPE)


def batches(out: Path) -> list[list[dict[str, Any]]]:
    if not out.exists():
        return []
    return [orjson.loads(line)["groups"] for line in out.read_bytes().splitlines() if line]


def test_no_group_lost_or_acked_twice_across_a_consumer_crash(
    fake_stack: LocalStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    s = fake_stack.settings
    url = f"http://{s.api_host}:{s.api_port}"
    tasks = [{"instruction": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(6)]
    with Client(url) as client:
        job_id = client.submit(
            tasks, samples_per_task=2, harness={"type": "reference"}, evaluator="completed",
            timeouts={"agent_s": 60},
        ).job_id  # fmt: skip

    out_a, out_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    trainer_a = start_consumer(url, job_id, "trainer-a", out_a, hold_after=1)
    try:
        deadline = time.monotonic() + 120
        while not batches(out_a):
            assert trainer_a.poll() is None, trainer_a.stderr.read() if trainer_a.stderr else ""
            assert time.monotonic() < deadline, "trainer A got no batch"
            time.sleep(0.1)
    finally:
        trainer_a.send_signal(signal.SIGKILL)
        trainer_a.wait(10)
    (first,) = batches(out_a)
    taken_by_a = {g["task_index"] for g in first}
    assert len(taken_by_a) == 2 and all(g["delivery"]["delivery_count"] == 1 for g in first)

    trainer_b = start_consumer(url, job_id, "trainer-b", out_b)
    try:
        _, err = trainer_b.communicate(timeout=180)
    finally:
        if trainer_b.poll() is None:
            trainer_b.kill()
            trainer_b.wait(10)
    assert trainer_b.returncode == 0, err.decode()[-2000:]

    received = [g for batch in batches(out_b) for g in batch]
    assert Counter(g["task_index"] for g in received) == Counter(range(6))  # each exactly once
    assert all(g["complete"] and g["n_samples"] == 2 for g in received)
    counts = {g["task_index"]: g["delivery"]["delivery_count"] for g in received}
    assert counts == {i: 2 if i in taken_by_a else 1 for i in range(6)}
    assert all(g["delivery"]["redelivered"] == (g["task_index"] in taken_by_a) for g in received)

    with db_session_factory() as session:
        rows = session.scalars(
            select(GroupDelivery).where(GroupDelivery.job_id == uuid.UUID(job_id))
        ).all()
    assert sorted(r.task_index for r in rows) == list(range(6))
    assert all(r.acked_at is not None and r.consumer == "trainer-b" for r in rows)
    assert {r.task_index: r.delivery_count for r in rows} == counts
    with Client(url) as client:
        final = client.lease_groups(job_id, "probe")
    assert final["done"] is True and final["groups_acked"] == 6 and final["groups"] == []
