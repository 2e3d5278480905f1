"""Several backends over real sockets: stickiness, rendezvous routing, run-time changes,
policy versions stamped on calls, and the admin endpoints' token and input checks."""

from __future__ import annotations

import uuid

import httpx
import pytest
from backends_support import (
    ADMIN,
    CHAT,
    Stack,
    auth,
    chat_body,
    proxy_stack,
    rollout_preferring,
    wait_until,
)
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import LlmCall
from polar_mq.proxy import DbCallWriter


def served_by(stack: Stack, rollout: uuid.UUID) -> set[str]:
    return {r["backend"] for r in stack.rows_of(rollout)}


def test_rollouts_stick_to_their_rendezvous_backend_whatever_the_load() -> None:
    with proxy_stack(n_fakes=2) as stack:
        a, b = stack.fakes
        rollouts = [rollout_preferring([x], stack.fakes) for x in (a, b, a, b)]
        for rollout in rollouts:
            assert stack.chat(rollout).status_code == 200
        for _ in range(3):  # later calls stay where each rollout started
            for rollout in rollouts:
                assert stack.chat(rollout, stream=True).status_code == 200
        wait_until(lambda: len(stack.sink.rows) == 16)
        assert [served_by(stack, r) for r in rollouts] == [{a}, {b}, {a}, {b}]
        assert stack.stats(a).requests == stack.stats(b).requests == 8

        # Two slow streams in flight on `a`: new rollouts still go to their own first choice
        # (load is this process's alone; another proxy process would choose differently).
        stack.fakes[a].state.fake.token_delay_s = 0.3
        with (
            stack.client.stream(
                "POST", f"{stack.url}{CHAT}", json=chat_body(True), headers=auth(rollouts[0])
            ) as first,
            stack.client.stream(
                "POST", f"{stack.url}{CHAT}", json=chat_body(True), headers=auth(rollouts[2])
            ) as second,
        ):
            lines = [first.iter_lines(), second.iter_lines()]
            assert all(next(it).startswith("data: ") for it in lines)
            assert stack.backends()[a]["in_flight"] == 2
            newcomers = [rollout_preferring([x], stack.fakes) for x in (a, b, a)]
            for rollout in newcomers:  # one token each: not paced like the streams on `a`
                assert stack.chat(rollout, max_tokens=1).status_code == 200
            assert [served_by(stack, r) for r in newcomers] == [{a}, {b}, {a}]
            stack.fakes[a].state.fake.token_delay_s = 0.0
            for it in lines:
                assert list(it)[-2:] == ["data: [DONE]", ""]
        wait_until(lambda: stack.backends()[a]["in_flight"] == 0)
        assert stack.backends()[a]["sticky_rollouts"] == 4
        assert stack.backends()[b]["sticky_rollouts"] == 3
        assert served_by(stack, rollouts[0]) == served_by(stack, rollouts[2]) == {a}


def test_policy_version_of_the_serving_backend_is_stamped_on_each_call() -> None:
    with proxy_stack(n_fakes=2) as stack:
        a, b = stack.fakes
        on_a, on_b = (rollout_preferring([x], stack.fakes) for x in (a, b))
        assert stack.chat(on_a).status_code == stack.chat(on_b).status_code == 200
        everywhere = stack.admin("POST", "/admin/policy_version", {"version": 7})
        assert everywhere.json() == {a: 7, b: 7}
        assert stack.chat(on_a).status_code == stack.chat(on_b, stream=True).status_code == 200
        one = stack.admin("POST", "/admin/policy_version", {"backend": b, "version": 8})
        assert one.json() == {b: 8}
        assert stack.chat(on_a, stream=True).status_code == stack.chat(on_b).status_code == 200
        wait_until(lambda: len(stack.sink.rows) == 6)
        versions = {
            r: [(row["backend"], row["policy_version"]) for row in stack.rows_of(r)]
            for r in (on_a, on_b)
        }
        assert versions == {on_a: [(a, 0), (a, 7), (a, 7)], on_b: [(b, 0), (b, 7), (b, 8)]}
        assert {n: s["policy_version"] for n, s in stack.backends().items()} == {a: 7, b: 8}


def test_backend_and_policy_version_land_in_postgres(
    pg_engine: Engine, db_session_factory: sessionmaker[Session]
) -> None:
    with proxy_stack(n_fakes=2, sink=DbCallWriter(engine=pg_engine)) as stack:
        a, b = stack.fakes
        rollouts = [rollout_preferring([x], stack.fakes) for x in (a, b)]
        stack.admin("POST", "/admin/policy_version", {"version": 41})
        stack.admin("POST", "/admin/policy_version", {"backend": b, "version": 42})
        for stream in (False, True):
            for rollout in rollouts:
                assert stack.chat(rollout, stream=stream).status_code == 200
        # A stream is logged just after its last byte: flush until the last one is in.
        wait_until(lambda: stack.admin("POST", "/admin/flush").json()["written"] == 4)
    with db_session_factory() as session:
        stored = session.execute(
            select(
                LlmCall.rollout_id, LlmCall.backend, LlmCall.policy_version, LlmCall.complete
            ).where(LlmCall.rollout_id.in_(rollouts))  # the session database is shared per worker
        ).all()
    assert sorted(tuple(row) for row in stored) == sorted(
        [(rollouts[0], a, 41, True)] * 2 + [(rollouts[1], b, 42, True)] * 2
    )


def test_backends_added_drained_and_removed_at_run_time() -> None:
    with proxy_stack(n_fakes=2) as stack:
        a, b = stack.fakes
        assert stack.admin("POST", "/admin/backends", {"action": "remove", "name": b}).is_success
        assert list(stack.backends()) == [a]
        old = uuid.uuid4()
        assert stack.chat(old).status_code == 200
        added = stack.admin("POST", "/admin/backends", {"action": "add", "url": b + "/v1"})
        assert added.status_code == 200 and list(stack.backends()) == [a, b]
        assert stack.admin("POST", "/admin/backends", {"action": "drain", "name": a}).is_success
        assert stack.backends()[a]["draining"] is True
        new = [uuid.uuid4() for _ in range(3)]
        for rollout in [*new, old]:
            assert stack.chat(rollout).status_code == 200
        assert all(served_by(stack, r) == {b} for r in new)
        assert served_by(stack, old) == {a}  # a draining backend keeps its rollouts
        assert stack.admin("POST", "/admin/backends", {"action": "remove", "name": a}).is_success
        assert stack.chat(old).status_code == 200  # the rollout moves once its backend is gone
        wait_until(lambda: len(stack.sink.rows) == 6)
        assert [r["backend"] for r in stack.rows_of(old)] == [a, a, b]
        assert list(stack.backends()) == [b]
        last = stack.admin("POST", "/admin/backends", {"action": "remove", "name": b})
        assert last.status_code == 409 and "last backend" in last.json()["error"]["message"]


ADMIN_CALLS = [
    ("GET", "/admin/backends", None),
    ("POST", "/admin/backends", {"action": "drain", "name": "x"}),
    ("POST", "/admin/pause", None),
    ("POST", "/admin/resume", None),
    ("POST", "/admin/policy_version", {"version": 3}),
]


def test_admin_endpoints_refuse_without_the_admin_token() -> None:
    with proxy_stack(n_fakes=1) as stack:
        rollout_token = auth(uuid.uuid4())
        for method, path, body in ADMIN_CALLS:
            for headers in ({}, rollout_token, {"authorization": "Bearer wrong"}):
                response = stack.client.request(
                    method, f"{stack.url}{path}", json=body, headers=headers
                )
                assert response.status_code == 401, (path, headers)
                assert response.json()["error"]["code"] == "invalid_api_key"
        (state,) = stack.backends().values()
        assert (state["paused"], state["draining"], state["policy_version"]) == (False, False, 0)
        assert stack.chat(uuid.uuid4()).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/admin/backends", {"action": "explode", "name": "x"}, 400, "action"),
        ("/admin/backends", {"action": "add"}, 400, "url"),
        ("/admin/backends", {"action": "add", "url": "ftp://x"}, 409, "http(s)"),
        ("/admin/backends", {"action": "drain", "name": "nope"}, 404, "nope"),
        ("/admin/backends", [1, 2], 400, "invalid admin request"),
        ("/admin/policy_version", {"version": -1}, 400, "version"),
        ("/admin/policy_version", {"version": "3"}, 400, "version"),
        ("/admin/policy_version", {"version": True}, 400, "version"),
        ("/admin/policy_version", {"version": 1, "backend": "nope"}, 404, "nope"),
        ("/admin/policy_version", {"version": 1, "extra": 1}, 400, "extra"),
        ("/admin/pause", {"backend": "nope"}, 404, "nope"),
        ("/admin/resume", "not an object", 400, "invalid admin request"),
    ],
)
def test_admin_bad_input_gets_a_clear_4xx(
    path: str, body: object, status: int, fragment: str
) -> None:
    with proxy_stack(n_fakes=1) as stack:
        response = stack.admin("POST", path, body)
        assert response.status_code == status, response.text
        assert fragment in response.json()["error"]["message"]
        raw = stack.client.post(f"{stack.url}{path}", content=b"{oops", headers=ADMIN)
        assert raw.status_code == 400
        (state,) = stack.backends().values()
        assert (state["paused"], state["policy_version"]) == (False, 0)


def test_duplicate_backend_is_refused() -> None:
    with proxy_stack(n_fakes=1) as stack:
        (name,) = stack.fakes
        response = stack.admin("POST", "/admin/backends", {"action": "add", "url": name})
        assert response.status_code == 409 and "already exists" in response.text
        assert isinstance(response.json()["error"], dict)
        assert len(stack.backends()) == 1
        assert httpx.get(f"{stack.url}/healthz").status_code == 200


def test_calls_go_upstream_through_the_own_client_and_are_logged_whole() -> None:
    """Plain and streamed calls, alternating on the backend's keep-alive pool (`upstream_pool`):
    each is answered, stored whole, and frees its in-flight slot."""
    with proxy_stack(n_fakes=1) as stack:
        rollout = uuid.uuid4()
        for stream in (False, True, False, True):
            response = stack.chat(rollout, stream=stream)
            assert response.status_code == 200
            assert response.text.rstrip().endswith("[DONE]") if stream else response.json()
        wait_until(lambda: len(stack.rows_of(rollout)) == 4)
        assert all(row["complete"] for row in stack.rows_of(rollout))
        (fake,) = stack.fakes
        assert stack.backends()[fake]["in_flight"] == 0
