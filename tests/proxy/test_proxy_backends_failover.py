"""A backend dies mid-run (SIGKILL of a fake engine process) and comes back.

Its started stream fails once (logged incomplete, not retried anywhere); later calls of its
rollouts are served by the survivor (retried before their first byte, then rebound once the
breaker opens); when the engine is back, a health check closes the breaker and new rollouts
are routed to it again.
"""

from __future__ import annotations

import orjson
from backends_support import (
    CHAT,
    FakeProcess,
    auth,
    chat_body,
    proxy_stack,
    rollout_preferring,
    wait_until,
)


def test_failover_when_a_backend_dies_mid_run_and_recovery_when_it_returns() -> None:
    with (
        FakeProcess(token_delay_ms=100) as victim,
        proxy_stack(n_fakes=1, extra_urls=(victim.url,)) as stack,
    ):
        (survivor,) = stack.fakes
        both = [victim.url, survivor]
        doomed, other = (rollout_preferring([x], both) for x in both)
        assert stack.chat(doomed).status_code == 200  # its first choice: the victim
        assert stack.chat(other).status_code == 200
        wait_until(lambda: len(stack.sink.rows) == 2)
        assert [r["backend"] for r in stack.sink.rows] == [victim.url, survivor]

        with stack.client.stream(
            "POST", f"{stack.url}{CHAT}", json=chat_body(True), headers=auth(doomed)
        ) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            victim.kill()
            events = [line for line in lines if line.startswith("data: ")]
        assert orjson.loads(events[-1].removeprefix("data: "))["error"]["code"] == "bad_gateway"
        wait_until(lambda: len(stack.sink.rows) == 3)
        broken = stack.sink.rows[2]
        assert (broken["backend"], broken["status_code"], broken["complete"]) == (
            victim.url,
            502,
            False,
        )
        assert stack.stats(survivor).requests == 1  # the started stream was not retried

        for stream in (False, True, False):  # the dead backend's rollout keeps working
            assert stack.chat(doomed, stream=stream).status_code == 200
        wait_until(lambda: stack.backends()[victim.url]["breaker"] != "closed")
        assert stack.chat(doomed).status_code == 200
        wait_until(lambda: len(stack.sink.rows) == 7)
        later = stack.rows_of(doomed)[2:]
        assert [(r["backend"], r["complete"]) for r in later] == [(survivor, True)] * 4
        state = stack.backends()
        assert state[victim.url]["sticky_rollouts"] == 0  # rebound after the breaker opened
        assert state[survivor]["sticky_rollouts"] == 2
        assert len(stack.sink.rows) == 7  # each call logged once, failed attempts are not

        victim.start()  # same port: the health check closes the breaker
        wait_until(lambda: stack.backends()[victim.url]["breaker"] == "closed")
        newcomer = rollout_preferring([victim.url], both)
        assert stack.chat(newcomer).status_code == 200
        assert stack.chat(doomed).status_code == 200  # stays where it was rebound
        wait_until(lambda: len(stack.sink.rows) == 9)
        assert [r["backend"] for r in stack.sink.rows[7:]] == [victim.url, survivor]
        assert stack.backends()[victim.url]["breaker_opened"] >= 1
