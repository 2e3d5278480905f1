"""Dashboard sign-in and access: the API's rules (key, scope, tenant) through a cookie."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from ui_support import sign_in, submit

from polar_mq.config import Settings
from polar_mq.ui.app import create_app
from tests.api.api_support import RecordingPublisher
from tests.ui.conftest import Keys


def test_without_a_cookie_every_page_redirects_to_the_login_form(client: TestClient) -> None:
    job = uuid.uuid4()
    for path in ("/ui/", "/ui/system", f"/ui/jobs/{job}", f"/ui/rollouts/{job}", "/ui/live"):
        answer = client.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/ui/login?next=/ui/"), path
    assert client.get("/ui/?cursor=x").headers["location"] == "/ui/login?next=/ui/%3Fcursor%3Dx"
    form = client.get("/ui/login")
    assert form.status_code == 200
    assert 'name="api_key"' in form.text


def test_login_sets_an_httponly_strict_cookie_and_returns_to_the_page(
    client: TestClient, keys: Keys
) -> None:
    answer = client.post("/ui/login", data={"api_key": keys.alice_read, "next": "/ui/system"})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/system"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"polar_mq_ui_key={keys.alice_read};")
    lowered = cookie.lower()
    assert "httponly" in lowered
    assert "samesite=strict" in lowered
    assert "path=/ui" in lowered
    jobs = client.get("/ui/")
    assert jobs.status_code == 200
    assert "tenant <b>alice</b>" in jobs.text
    assert jobs.headers["cache-control"] == "no-store"
    assert "script-src 'self'" in jobs.headers["content-security-policy"]
    out = client.post("/ui/logout")
    assert out.status_code == 303
    assert client.get("/ui/").status_code == 303


def test_a_bad_key_or_a_key_without_read_scope_is_refused(client: TestClient, keys: Keys) -> None:
    wrong = client.post("/ui/login", data={"api_key": "pmq_not-a-key", "next": "/ui/"})
    assert wrong.status_code == 401
    assert "invalid or revoked API key" in wrong.text
    assert "set-cookie" not in wrong.headers
    empty = client.post("/ui/login", data={"api_key": ""})
    assert empty.status_code == 401
    policy_only = client.post("/ui/login", data={"api_key": keys.alice_policy_only})
    assert policy_only.status_code == 403
    assert "jobs:read" in policy_only.text
    # a cookie set by hand with such a key is no better
    client.cookies.set("polar_mq_ui_key", keys.alice_policy_only, path="/ui")
    assert client.get("/ui/").status_code == 403
    client.cookies.set("polar_mq_ui_key", "pmq_forged", path="/ui")
    assert client.get("/ui/").status_code == 303


def test_login_never_redirects_off_the_dashboard(client: TestClient, keys: Keys) -> None:
    for target in ("https://evil.example/", "//evil.example/ui", "/v1/jobs", "/ui\\@evil"):
        answer = client.post("/ui/login", data={"api_key": keys.alice_read, "next": target})
        assert answer.headers["location"] == "/ui/", target


def test_a_tenant_sees_only_its_own_jobs_and_rollouts(client: TestClient, keys: Keys) -> None:
    alice_job, alice_rollouts = submit(client, keys.alice_write, [{"instruction": "a"}], 2)
    bob_job, _ = submit(client, keys.bob_write, [{"instruction": "b"}], 1)

    sign_in(client, keys.bob_read)
    listing = client.get("/ui/").text
    assert str(bob_job)[:8] in listing
    assert str(alice_job) not in listing
    for path in (
        f"/ui/jobs/{alice_job}",
        f"/ui/jobs/{alice_job}/live",
        f"/ui/rollouts/{alice_rollouts[0]}",
        f"/ui/rollouts/{alice_rollouts[0]}/live",
        f"/ui/rollouts/{alice_rollouts[0]}/artifacts/agent.log",
    ):
        answer = client.get(path)
        assert answer.status_code == 404, path
        assert "not found" in answer.text
    missing = client.get(f"/ui/jobs/{uuid.uuid4()}")
    assert missing.status_code == 404
    assert client.get("/ui/jobs/not-a-uuid").status_code == 422

    sign_in(client, keys.alice_read)
    assert str(alice_job) in client.get(f"/ui/jobs/{alice_job}").text
    assert client.get(f"/ui/rollouts/{alice_rollouts[0]}").status_code == 200
    assert str(bob_job)[:8] not in client.get("/ui/").text


def test_without_keys_the_dashboard_is_open_like_the_api(
    settings: Settings, db_session_factory: sessionmaker[Session]
) -> None:
    app = create_app(
        settings,
        session_factory=db_session_factory,
        publisher=RecordingPublisher(db_session_factory),
    )
    with TestClient(app, follow_redirects=False) as client:
        job, _ = submit(client, "unused", [{"instruction": "x"}], 1)
        page = client.get("/ui/")
        assert page.status_code == 200
        assert str(job)[:8] in page.text
        assert "Sign out" not in page.text
