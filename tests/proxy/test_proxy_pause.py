"""Weight updates over real sockets: pause holds new calls (then 503 + Retry-After), in-flight
calls drain and complete, resume releases the held calls; one backend can be paused alone."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from backends_support import CHAT, auth, chat_body, proxy_stack, rollout_preferring, wait_until


def test_pause_holds_new_calls_drains_in_flight_and_resume_releases() -> None:
    with proxy_stack(n_fakes=1) as stack, ThreadPoolExecutor(2) as pool:
        (name,) = stack.fakes
        fake = stack.fakes[name].state.fake
        streaming, held = uuid.uuid4(), uuid.uuid4()
        fake.token_delay_s = 0.2  # the in-flight stream outlives the pause request
        with stack.client.stream(
            "POST", f"{stack.url}{CHAT}", json=chat_body(True), headers=auth(streaming)
        ) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            paused = stack.admin("POST", "/admin/pause")
            assert paused.json() == {"paused": [name], "in_flight": 1, "drained": False}
            drain = pool.submit(stack.admin, "POST", "/admin/pause", wait_drained="true")
            waiting = pool.submit(stack.chat, held)
            wait_until(lambda: stack.backends()[name]["waiting"] == 1)
            assert stack.stats(name).requests == 1  # held in the proxy, not forwarded
            fake.token_delay_s = 0.0
            rest = list(lines)  # the in-flight stream runs to its end during the pause
            assert rest[-2:] == ["data: [DONE]", ""]
        assert drain.result(30).json() == {"paused": [name], "in_flight": 0, "drained": True}
        assert not waiting.done() and stack.backends()[name]["paused"] is True
        assert stack.admin("POST", "/admin/resume").json() == {"resumed": [name]}
        assert waiting.result(30).status_code == 200
        wait_until(lambda: len(stack.sink.rows) == 2)
        first, second = stack.sink.rows
        assert (first["rollout_id"], first["complete"], first["status_code"]) == (
            streaming,
            True,
            200,
        )
        assert (second["rollout_id"], second["complete"]) == (held, True)
        assert stack.backends()[name]["waiting"] == 0


def test_a_call_held_past_the_bound_gets_a_retryable_503() -> None:
    with proxy_stack(n_fakes=1, pause_max_wait_s=0.3) as stack:
        (name,) = stack.fakes
        assert stack.admin("POST", "/admin/pause", {"backend": name}).json()["drained"] is True
        for stream in (False, True):
            response = stack.chat(uuid.uuid4(), stream=stream)
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            error = response.json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "backend_paused")
        assert stack.stats(name).requests == 0 and stack.sink.rows == []
        stack.admin("POST", "/admin/resume", {"backend": name})
        assert stack.chat(uuid.uuid4()).status_code == 200


def test_pausing_one_backend_sends_new_rollouts_to_the_others() -> None:
    with proxy_stack(n_fakes=2, pause_max_wait_s=0.3) as stack:
        a, b = stack.fakes
        on_a = rollout_preferring([a], stack.fakes)
        assert stack.chat(on_a).status_code == 200
        assert stack.admin("POST", "/admin/pause", {"backend": a}).json()["paused"] == [a]
        newcomers = [rollout_preferring([a], stack.fakes) for _ in range(3)]  # a: paused
        assert all(stack.chat(r).status_code == 200 for r in newcomers)
        assert stack.stats(b).requests == 3
        # A rollout bound to the paused backend waits for it (here: past the bound).
        assert stack.chat(on_a).status_code == 503
        stack.admin("POST", "/admin/resume")
        assert stack.chat(on_a).status_code == 200
        assert stack.stats(a).requests == 2
        assert {n: s["paused"] for n, s in stack.backends().items()} == {a: False, b: False}
