"""The system page: policy from the database, stages in flight by node, and the parts it cannot
read (no worker, no proxy here) reported instead of failing the page."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from ui_support import sign_in, submit

from polar_mq.infra.db import unit_of_work
from polar_mq.policy.state import write_policy
from tests.ui.conftest import Keys


def test_system_page_shows_policy_and_in_flight_and_says_what_is_unreachable(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    submit(client, keys.alice_write, [{"instruction": "a"}], 3)
    with unit_of_work(db_session_factory) as session:
        write_policy(session, version=7, paused=True)
    sign_in(client, keys.alice_read)
    page = client.get("/ui/system")
    assert page.status_code == 200
    text = page.text
    assert 'id="policy-version">7<' in text
    assert 'id="policy-paused">paused<' in text
    assert "prepare queued 3" in text  # submitted, waiting for a worker, no node yet
    assert "unreachable: ConnectError" in text  # the proxy admin endpoint of the settings
    assert "no worker answered" in text
