"""The stage workers' thread pool runs each task's completion callback (Celery's late ack) on
the consumer's event-loop thread, never on the pool thread that ran the task: py-amqp's
connection is not thread-safe (`polar_mq.workers.thread_pool`)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.concurrency import thread
from kombu.asynchronous import Hub
from kombu.utils.imports import symbol_by_name

from polar_mq.workers.thread_pool import POOL_PATH, TaskPool


@pytest.fixture
def pool() -> Iterator[TaskPool]:
    made = TaskPool(limit=2)
    made.start()
    yield made
    made.stop()


def run_loop(hub: Hub, done: Any, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not done() and time.monotonic() < end:
        hub.run_once()
    assert done(), "the loop never ran the callback"


def test_the_callback_runs_on_the_loop_thread(pool: TaskPool) -> None:
    hub = Hub()
    pool.register_with_event_loop(hub)
    ran: list[tuple[str, int]] = []
    worked: list[int] = []

    def task() -> str:
        worked.append(threading.get_ident())
        return "ok"

    pool.apply_async(task, callback=lambda result: ran.append((result, threading.get_ident())))
    run_loop(hub, lambda: ran)
    assert ran == [("ok", threading.get_ident())]  # the loop's thread, this one
    assert worked and worked[0] != threading.get_ident()  # the task itself ran on a pool thread
    hub.close()


def test_many_callbacks_wake_the_loop_each_time(pool: TaskPool) -> None:
    hub = Hub()
    pool.register_with_event_loop(hub)
    ran: list[int] = []
    for i in range(50):
        pool.apply_async(lambda i=i: i, callback=ran.append)
    run_loop(hub, lambda: len(ran) == 50)
    assert sorted(ran) == list(range(50))
    hub.close()


def test_without_a_loop_the_callback_runs_where_the_task_ran(pool: TaskPool) -> None:
    ran: list[int] = []
    pool.apply_async(lambda: None, callback=lambda _: ran.append(threading.get_ident()))
    deadline = time.monotonic() + 10
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran and ran[0] != threading.get_ident()


def test_stop_runs_what_the_last_tasks_queued() -> None:
    made = TaskPool(limit=1)
    made.start()
    hub = Hub()
    made.register_with_event_loop(hub)
    ran: list[str] = []
    made.apply_async(lambda: time.sleep(0.2) or "late", callback=ran.append)
    made.stop()  # the loop never runs again: the ack must not be lost
    assert ran == ["late"]
    hub.close()


def test_threads_means_this_pool_for_workers_of_our_app() -> None:
    """What `celery -A polar_mq.workers.entry worker -P threads` resolves: the entry module,
    loaded before the pool name, installs it (in a fresh interpreter, as a worker would)."""
    code = (
        "import polar_mq.workers.entry\n"
        "from celery import concurrency\n"
        "print(concurrency.get_implementation('threads').__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "polar_mq.workers.thread_pool"
    assert issubclass(symbol_by_name(POOL_PATH), thread.TaskPool)
