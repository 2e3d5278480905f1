"""The job option `tito: auto | off`: validated at submit, carried in the rollout token, obeyed
by the proxy (a job with `off` gets the chat path on a TITO proxy, every family included)."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields

import pytest
from fastapi.testclient import TestClient
from proxy_support import SECRET, Harness, proxy_settings, start_harness
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from test_tito_families import LOOPS
from tito_support import run_agent

from polar_mq.capability.tokens import InvalidToken, issue_rollout_token, verify_rollout_token
from polar_mq.config import Settings
from polar_mq.jobs.schemas import JobCreate
from polar_mq.models import Job
from polar_mq.spec import load_spec
from polar_mq.ui.app import create_app
from tests.api.api_support import REDIS_URL, RecordingPublisher

TASK = {"instruction": "What is 6*7?"}


def test_chat_only_rides_in_the_token_with_the_other_marks() -> None:
    rollout = uuid.uuid4()
    for receipts in (False, True):
        for unbudgeted in (False, True):
            for chat_only in (False, True):
                token = issue_rollout_token(
                    SECRET, rollout, 60, attempt=2, receipts=receipts,
                    unbudgeted=unbudgeted, chat_only=chat_only,
                )  # fmt: skip
                claim = verify_rollout_token(SECRET, token)
                got = (claim.attempt, claim.receipts, claim.unbudgeted, claim.chat_only)
                assert got == (2, receipts, unbudgeted, chat_only)
    assert "_2rnc_" in issue_rollout_token(
        SECRET, rollout, 60, attempt=2, receipts=True, unbudgeted=True, chat_only=True
    )
    plain = verify_rollout_token(SECRET, issue_rollout_token(SECRET, rollout, 60, attempt=1))
    assert plain.chat_only is False  # tokens without the mark: TITO as the proxy says
    with pytest.raises(ValueError, match="carried by the attempt"):
        issue_rollout_token(SECRET, rollout, 60, chat_only=True)


def test_marks_out_of_order_are_refused() -> None:
    token = issue_rollout_token(SECRET, uuid.uuid4(), 60, attempt=2, receipts=True, chat_only=True)
    assert "_2rc_" in token
    head, _, _ = token.rpartition("_")
    forged = head.replace("_2rc", "_2cr")
    signature = hmac.new(SECRET.encode(), forged.encode(), hashlib.sha256).hexdigest()[:32]
    with pytest.raises(InvalidToken):
        verify_rollout_token(SECRET, f"{forged}_{signature}")


def test_job_spec_keeps_the_option_and_refuses_a_bad_value() -> None:
    assert JobCreate(tasks=[TASK]).job_spec().tito == "auto"
    spec = JobCreate(tasks=[TASK], tito="off").job_spec()
    assert spec.tito == "off" and spec.stored()["tito"] == "off"
    assert load_spec({k: v for k, v in spec.stored().items() if k != "tito"}).tito == "auto"
    for bad in ("on", "yes", True, None):
        with pytest.raises(ValidationError, match="tito"):
            JobCreate.model_validate({"tasks": [TASK], "tito": bad})


@pytest.fixture()
def api(pg_url: str, db_session_factory: sessionmaker[Session]) -> Iterator[TestClient]:
    settings = Settings.model_validate(
        {"database_url": pg_url, "broker_url": f"{REDIS_URL}/0", "pool": "cpu"}
    )
    app = create_app(
        settings,
        session_factory=db_session_factory,
        publisher=RecordingPublisher(db_session_factory),
    )
    with TestClient(app) as client:
        yield client


def test_submit_answers_422_on_a_bad_value_and_stores_a_good_one(
    api: TestClient, db_session_factory: sessionmaker[Session]
) -> None:
    bad = api.post("/v1/jobs", json={"tasks": [TASK], "tito": "on"})
    assert bad.status_code == 422, bad.text
    error = bad.json()["error"]
    assert error["type"] and "tito" in error["message"]
    good = api.post("/v1/jobs", json={"tasks": [TASK], "tito": "off"})
    assert good.status_code == 201, good.text
    with db_session_factory() as session:
        job = session.get_one(Job, uuid.UUID(good.json()["job_id"]))
        assert load_spec(job.spec).tito == "off"


@dataclass
class JobHarness(Harness):
    """The harness whose agent holds a token as the run-agent stage issues it for the job."""

    chat_only: bool = False

    @property
    def token(self) -> str:
        return issue_rollout_token(
            SECRET, self.rollout_id, 600, attempt=1, chat_only=self.chat_only
        )


@pytest.mark.anyio
@pytest.mark.parametrize("chat_only", [False, True])
async def test_a_chat_only_rollout_goes_the_chat_way_on_a_tito_proxy(chat_only: bool) -> None:
    async for base in start_harness(proxy_settings(proxy_tito="on")):
        h = JobHarness(**{f.name: getattr(base, f.name) for f in fields(base)}, chat_only=chat_only)
        turns = await run_agent(h)
        rows = await h.rows()
        assert len(rows) == len(turns) == 6
        if chat_only:  # no token prompt, no /tokenize: TITO is off for this job's rollouts
            assert [(r["prompt_source"], r["tito_fallback"]) for r in rows] == [("chat", None)] * 6
            assert h.stats.paths.get("/v1/completions", 0) == 0
            assert h.stats.paths.get("/tokenize", 0) == 0
        else:
            assert [r["prompt_source"] for r in rows] == ["chat"] + ["tito"] * 5
            assert h.stats.paths["/v1/completions"] == 5


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(LOOPS))
async def test_a_chat_only_family_call_goes_the_chat_way(name: str) -> None:
    async for base in start_harness(proxy_settings(proxy_tito="on")):
        h = JobHarness(**{f.name: getattr(base, f.name) for f in fields(base)}, chat_only=True)
        await LOOPS[name](h, False)
        rows = await h.rows()
        assert [(r["api_type"], r["prompt_source"], r["tito_fallback"]) for r in rows] == [
            (name, "chat", None),
            (name, "chat", None),
        ]
        assert h.stats.paths.get("/v1/completions", 0) == 0
