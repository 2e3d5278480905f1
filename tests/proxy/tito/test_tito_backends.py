"""A backend's own TITO setting (`proxy_tito_backends`, admin `add` with `tito`) over the proxy's.

Two backends in front of the fake vLLM (the same fake through the injected transport, named
apart): a rollout's calls go token-in only when the backend it sticks to has TITO on, whatever
the proxy's default; a job's `tito: off` (a chat-only token) still keeps them on the chat path;
the admin API sets the mode of a backend it adds and refuses one the proxy cannot honour.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
from proxy_support import UPSTREAM, Harness, proxy_settings, start_harness
from test_tito_job_option import JobHarness
from tito_support import run_agent

from polar_mq.testing.fake_sglang import create_fake_sglang_app

pytestmark = pytest.mark.anyio

ADMIN = "admin-secret"
OTHER = "http://other.test"


def settings(**overrides: Any) -> Any:
    return proxy_settings(upstream_urls=[UPSTREAM, OTHER], proxy_admin_token=ADMIN, **overrides)


def sources(rows: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(r["prompt_source"], r["tito_fallback"]) for r in rows]


async def sticks_to(h: Harness, backend: str) -> Harness:
    """A harness whose rollout the pool sends to `backend` (rollouts are spread by hash)."""
    pool = h.app.state.proxy.backends
    while True:
        probe = Harness(**{f.name: getattr(h, f.name) for f in fields(h) if f.name != "rollout_id"})
        if (await pool.choose(probe.rollout_id)).name == backend:
            return probe


@pytest.mark.parametrize(
    ("default", "backend", "on"),
    [("off", "on", True), ("off", "auto", True), ("on", "off", False), ("auto", "off", False)],
)
async def test_a_backends_setting_overrides_the_proxys(
    default: str, backend: str, on: bool
) -> None:
    config = settings(proxy_tito=default, proxy_tito_backends={UPSTREAM: backend})
    async for base in start_harness(config):
        mine = await sticks_to(base, UPSTREAM)
        other = await sticks_to(base, OTHER)
        await run_agent(mine)
        mine_rows = await mine.rows()
        completions = mine.stats.paths.get("/v1/completions", 0)
        if on:
            assert sources(mine_rows) == [("chat", "first_call")] + [("tito", None)] * 5
            assert completions == 5
        else:  # as with TITO off: no turn kept, no fallback recorded, no /tokenize
            assert sources(mine_rows) == [("chat", None)] * 6
            assert completions == 0 and mine.stats.paths.get("/tokenize", 0) == 0
        base.sink.rows.clear()
        await run_agent(other)  # the other backend follows the proxy's default
        other_rows = await other.rows()
        assert other_rows and all(r["backend"] == OTHER for r in other_rows)
        default_on = default != "off"
        assert (other_rows[1]["prompt_source"] == "tito") is default_on


async def test_a_chat_only_job_stays_off_on_a_tito_backend() -> None:
    async for base in start_harness(settings(proxy_tito_backends={UPSTREAM: "on"})):
        mine = await sticks_to(base, UPSTREAM)
        h = JobHarness(**{f.name: getattr(mine, f.name) for f in fields(mine)}, chat_only=True)
        await run_agent(h)
        assert sources(await h.rows()) == [("chat", None)] * 6
        assert h.stats.paths.get("/v1/completions", 0) == 0


async def test_the_admin_api_sets_an_added_backends_mode() -> None:
    async for h in start_harness(proxy_settings(proxy_tito="on", proxy_admin_token=ADMIN)):
        admin = {"authorization": f"Bearer {ADMIN}"}
        add = {"action": "add", "url": OTHER, "name": "other", "tito": "off"}
        added = await h.client.post("/admin/backends", json=add, headers=admin)
        assert added.status_code == 200, added.text
        bad = {"action": "add", "url": "http://x.test", "tito": "sometimes"}
        refused = await h.client.post("/admin/backends", json=bad, headers=admin)
        assert refused.status_code == 400 and "tito" in refused.text
        drop = {"action": "remove", "name": UPSTREAM}
        assert (await h.client.post("/admin/backends", json=drop, headers=admin)).is_success
        await run_agent(h)  # every call now lands on "other", whose TITO is off
        rows = await h.rows()
        assert sources(rows) == [("chat", None)] * 6 and {r["backend"] for r in rows} == {"other"}


async def test_the_admin_api_refuses_a_mode_the_proxy_cannot_honour() -> None:
    admin = {"authorization": f"Bearer {ADMIN}"}
    add = {"action": "add", "url": OTHER, "name": "other", "tito": "on"}
    async for h in start_harness(proxy_settings(proxy_admin_token=ADMIN)):  # TITO off
        refused = await h.client.post("/admin/backends", json=add, headers=admin)
        assert refused.status_code == 400 and "without token-in" in refused.text
    generic = proxy_settings(
        upstream_engine="generic", proxy_admin_token=ADMIN, proxy_tito_backends={UPSTREAM: "off"}
    )
    async for h in start_harness(generic, create_fake_sglang_app()):
        assert h.app.state.proxy.tito is None  # nothing can go token-in on a generic engine
        refused = await h.client.post("/admin/backends", json=add, headers=admin)
        assert refused.status_code == 400
