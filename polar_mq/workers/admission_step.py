"""The Celery side of prepare admission (`workers.admission`): a consumer bootstep of the node's
prepare worker that pauses and resumes its consumption of the pool-wide prepare queue.

Celery's consumer connection is not thread-safe (see `thread_pool`), so every decision and every
`cancel_task_queue` / `add_task_queue` runs on the consumer's own thread: every `TICK_S` from its
timer (the event loop's timer, when there is one) and, right after each prepare message arrives,
from `call_soon`, which runs once Celery has reserved the message. The database count runs on the
counter's own thread (`PreparedCounter`); a decision only reads what it left.

A consumer restart (a broker reconnect) starts the step again, consuming: Celery rebuilds its
task consumer from the selected queues, which a pause had deselected, so the queue is selected
again first; a worker restart starts consuming anyway. Installed for every worker of the app
(`workers.entry`); it only acts in one that consumes its pool's prepare queue.
"""

from __future__ import annotations

import logging
import time
from functools import cache
from typing import Any

from celery import bootsteps, signals
from celery.worker import state
from prometheus_client import Gauge

from polar_mq.lifecycle.messages import queue_name
from polar_mq.lifecycle.stages import Stage
from polar_mq.workers.admission import (
    AdmissionGate,
    PreparedCounter,
    Verdict,
    admission_window,
    prepared_on_node,
)

log = logging.getLogger("polar_mq.workers.admission")
PREPARE_TASK = Stage.PREPARE.task_name
TICK_S = 0.05
"""How often the consumer's thread decides without a message arriving: it picks up new counts
(an agent started: resume) and notices prepares that finished (ask for a count). A decision
reads in-process state only: no I/O on the event loop."""
FIRST_COUNT_WAIT_S = 2.0
"""How long a (re)starting consumer waits for its first count before it consumes: a worker
restarted on a full node must not take a prefetch's worth first; past it, it fails open."""


@cache
def _gauges() -> tuple[Gauge, Gauge, Gauge]:
    """This process's admission gauges (the node sums its stage workers' metric files; a
    restarted worker's values replace its predecessor's: `mostrecent`)."""
    return (
        Gauge("polar_prepare_admission_paused",
              "1 while this node's prepare worker takes no new rollouts (backlog at the window)",
              multiprocess_mode="mostrecent", registry=None),
        Gauge("polar_prepare_backlog",
              "This node's rollouts prepared or being prepared, not yet running their agent "
              "(an upper bound; -1: unknown, admission open)",
              multiprocess_mode="mostrecent", registry=None),
        Gauge("polar_prepare_admission_window",
              "Backlog at which this node's prepare worker pauses",
              multiprocess_mode="mostrecent", registry=None),
    )  # fmt: skip


def prepare_requests_held() -> frozenset[str]:
    """The ids of the prepare messages this worker holds: reserved (running or about to) or
    scheduled for a retry's countdown. On the consumer's thread, where Celery changes both."""
    for _ in range(3):  # without an event loop a pool thread may change them meanwhile: again
        try:
            held = (*state.reserved_requests, *state.scheduled_requests)
        except RuntimeError:
            continue
        return frozenset(request.id for request in held if request.name == PREPARE_TASK)
    return frozenset()


class PrepareAdmission(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    """Pauses the pool-wide prepare queue while the node's backlog is at the window."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        settings = c.app.polar_settings
        self.queue = queue_name(settings.queue_prefix, Stage.PREPARE, settings.pool, None)
        window = admission_window(settings)
        self.enabled = window > 0 and self.queue in c.app.amqp.queues.consume_from
        self.consumer = c
        self.paused = False
        self._shown: int | None = None
        self._entry: Any = None
        if not self.enabled:
            if window == 0 and self.queue in c.app.amqp.queues.consume_from:
                log.info("prepare admission is off (POLAR_MQ_PREPARE_ADMISSION_WINDOW=0)")
            return
        self.gate = AdmissionGate(window)
        self.counter = PreparedCounter(self.gate, prepared_on_node(settings)).start()
        uid = f"polar_mq.admission.{id(self)}"
        signals.task_received.connect(self._received, weak=False, dispatch_uid=uid)
        _gauges()[2].set(window)
        log.info("prepare admission: window %d on %s", window, self.queue)

    def start(self, c: Any) -> None:
        self.paused = False
        _gauges()[0].set(0)
        if self.queue not in c.app.amqp.queues.consume_from:  # paused before a reconnect
            c.add_task_queue(self.queue)
        self._entry = c.timer.call_repeatedly(TICK_S, self._tick)
        self.counter.wait_first(FIRST_COUNT_WAIT_S)
        self._check()  # before the event loop consumes

    def stop(self, c: Any) -> None:
        if self._entry is not None:
            c.timer.cancel(self._entry)
            self._entry = None

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        self.counter.stop()
        uid = f"polar_mq.admission.{id(self)}"
        signals.task_received.disconnect(dispatch_uid=uid)

    terminate = shutdown

    def _received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        """`task_received`, on the consumer's thread before Celery reserves the request: decide
        once it has (`call_soon` runs after this message's handling)."""
        if sender is self.consumer and getattr(request, "name", None) == PREPARE_TASK:
            self.consumer.call_soon(self._check)

    def _tick(self) -> None:
        """The timer's entry: on the event loop's thread with a hub, else on the timer's own
        thread, which hands the decision to the consumer's (`call_soon`)."""
        if self.consumer.hub is not None:
            self._check()
        else:
            self.consumer.call_soon(self._check)

    def _check(self) -> None:
        """On the consumer's thread: decide, act on a change, log it once."""
        verdict = self.gate.decide(prepare_requests_held(), time.monotonic())
        if verdict.recount:
            self.counter.recount()
        paused, backlog, _window = _gauges()
        shown = -1 if verdict.backlog is None else verdict.backlog
        if shown != self._shown:  # a gauge write is a file write: only on a change
            backlog.set(shown)
            self._shown = shown
        if verdict.pause == self.paused:
            return
        if verdict.pause:
            self.consumer.cancel_task_queue(self.queue)
        else:
            self.consumer.add_task_queue(self.queue)
        self.paused = verdict.pause
        paused.set(1 if verdict.pause else 0)
        self._log(verdict)

    def _log(self, verdict: Verdict) -> None:
        window = self.gate.window
        if verdict.backlog is None:
            log.warning("prepare resumed: no count of this node's prepared rollouts for %.0f s; "
                        "taking prepares without admission", self.gate.stale_after_s)  # fmt: skip
        elif verdict.pause:
            log.info("prepare paused: backlog %d >= window %d", verdict.backlog, window)
        else:
            log.info("prepare resumed: backlog %d < window %d", verdict.backlog, window)
