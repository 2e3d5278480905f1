"""A proxy token dies with its rollout: real proxy, real workers, real rollouts ending.

The agent prints its own token (its API key) before it starts, so the test holds exactly what a
leftover agent process would hold. After the rollout completes, or is cancelled while its agent
runs, that token is refused by the running proxy in every API family's error shape within the
documented bound (`proxy_rollout_state_ttl_s` plus one query); a signed token of a rollout that
never existed is refused at once; the token's expiry follows the job's own time limits; and the
evaluate stage's judge token works while the rollout is being evaluated.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import JUDGE, issue_rollout_token, verify_rollout_token
from polar_mq.config import TOKEN_GRACE_S
from polar_mq.models import LlmCall
from polar_mq.runtimes.host_exec import tagged_pids
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, fake_upstream_stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

STATE_TTL_S = 1.0
BOUND_S = STATE_TTL_S + 4.0
"""The refusal bound the docs promise (ttl + one query), with room for a loaded test machine."""
AGENT_S = 40
TASK = {"instruction": "What is 6*7?", "answer": "42", "grade": 7}
JUDGE_EVALUATOR = {
    "name": "llm_judge",
    "prompt": "RESULT: Score: {grade}/10 for {answer!r} (question: {instruction})",
    "system": "Grade.",
}
SHOW_TOKEN = 'echo "TOKEN=$OPENAI_API_KEY" | tee token.txt; '
RESPONSES = {"model": "m", "input": "hi"}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "RESULT: 1"}]}


@pytest.fixture(scope="module")
def stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("token-death")
    with fake_upstream_stack(pg_url, tmp, proxy_rollout_state_ttl_s=STATE_TTL_S) as running:
        yield running


def agent_token(stack: LocalStack, rollout_id: uuid.UUID, timeout_s: float = 60) -> str:
    """The token the agent of `rollout_id` showed: in its log once it ended, in its workspace
    while it runs (the worker writes the log when the agent exits)."""
    pattern = re.compile(rf"TOKEN=(pmq_{rollout_id.hex}_\S+)")
    root = Path(stack.settings.runtime_root)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in [*root.glob("logs/*.log"), *root.glob("**/workspace/token.txt")]:
            with contextlib.suppress(OSError):
                found = pattern.search(path.read_text(errors="replace"))
                if found:
                    return found.group(1)
        time.sleep(0.2)
    raise AssertionError(f"the agent of {rollout_id} printed no token")


def calls(stack: LocalStack, token: str) -> dict[str, httpx.Response]:
    """One call per API family with `token` as the agent's key."""
    base = stack.settings.proxy_base_url
    with httpx.Client(base_url=base, timeout=30) as http:
        bearer = {"authorization": f"Bearer {token}"}
        messages = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        gemini = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        return {
            "chat": http.post("/v1/chat/completions", json=CHAT, headers=bearer),
            "anthropic": http.post("/v1/messages", json=messages, headers={"x-api-key": token}),
            "responses": http.post("/v1/responses", json=RESPONSES, headers=bearer),
            "gemini": http.post(
                "/v1beta/models/m:generateContent", json=gemini, headers={"x-goog-api-key": token}
            ),
            "path_token": http.post(f"/r/{token}/v1/chat/completions", json=CHAT),
        }


def assert_refused_everywhere(answers: dict[str, httpx.Response], status: int, code: str) -> None:
    for family, response in answers.items():
        assert response.status_code == status, (family, response.text)
    chat = answers["chat"].json()["error"]
    assert chat["code"] == code and chat["type"] == "invalid_request_error", chat
    assert answers["path_token"].json()["error"]["code"] == code
    anthropic = answers["anthropic"].json()
    expected = "permission_error" if status == 403 else "authentication_error"
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == expected, anthropic
    assert answers["responses"].json()["error"]["message"] == chat["message"]
    google = "PERMISSION_DENIED" if status == 403 else "UNAUTHENTICATED"
    assert answers["gemini"].json()["error"]["status"] == google


def refused_within(stack: LocalStack, token: str, bound_s: float) -> float:
    """Seconds until the chat route refuses `token` (fails past `bound_s`)."""
    started = time.monotonic()
    with httpx.Client(base_url=stack.settings.proxy_base_url, timeout=30) as http:
        while True:
            response = http.post(
                "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {token}"}
            )
            elapsed = time.monotonic() - started
            if response.status_code == 403:
                return elapsed
            assert response.status_code == 200, response.text
            assert elapsed < bound_s, f"still served {elapsed:.1f} s after the rollout ended"
            time.sleep(0.1)


def test_tokens_die_when_their_rollout_completes(
    stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    client = client_of(stack)
    command = SHOW_TOKEN + "{python} -m polar_mq.agents.tool_agent"
    submitted_at = time.time()
    submitted = client.submit(
        [TASK],
        harness={"type": "command", "command": command},
        evaluator=JUDGE_EVALUATOR,
        timeouts={"agent_s": AGENT_S},
    )
    rollout_id = uuid.UUID(str(submitted.rollout_ids[0]))
    token = agent_token(stack, rollout_id)
    status = client.wait(str(submitted.job_id), progress=False, timeout=180)
    ended_at = time.monotonic()
    finished_at = time.time()
    assert status["by_status"] == {"completed": 1}, status

    # the agent's token expires with the job's time limit, not after a day: it was issued when
    # the agent started, between the submit and the job's end (a loaded machine may queue the
    # rollout for seconds, so the bounds are that window, not a fixed slack)
    claim = verify_rollout_token(stack.settings.secret_key, token)
    assert claim.expires_at <= finished_at + AGENT_S + TOKEN_GRACE_S + 1
    assert claim.expires_at >= submitted_at + AGENT_S

    # the judge called through the proxy while the rollout was being evaluated
    rollout = client.rollout(str(rollout_id))
    assert rollout["reward"] == pytest.approx(0.7), rollout
    with db_session_factory() as session:
        purposes = session.scalars(
            select(LlmCall.purpose).where(LlmCall.rollout_id == rollout_id)
        ).all()
    assert "judge" in purposes and "agent" in purposes

    # ... and then the rollout's tokens, the agent's and a judge's, are refused
    waited = refused_within(stack, token, BOUND_S - (time.monotonic() - ended_at))
    print(f"token refused {waited:.2f} s after the job was seen finished")
    assert_refused_everywhere(calls(stack, token), 403, "rollout_ended")
    judge = issue_rollout_token(stack.settings.secret_key, rollout_id, 600, purpose=JUDGE)
    assert_refused_everywhere(calls(stack, judge), 403, "rollout_ended")


def test_tokens_die_when_their_rollout_is_cancelled(stack: LocalStack) -> None:
    client = client_of(stack)
    submitted = client.submit(
        [{"instruction": "wait"}],
        harness={"type": "command", "command": SHOW_TOKEN + "sleep 120"},
        timeouts={"agent_s": 150},
    )
    rollout_id = uuid.UUID(str(submitted.rollout_ids[0]))
    token = agent_token(stack, rollout_id)
    with httpx.Client(base_url=stack.settings.proxy_base_url, timeout=30) as http:
        running = http.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {token}"}
        )
    assert running.status_code == 200, running.text  # a live rollout is served
    client.cancel(str(submitted.job_id))
    refused_within(stack, token, BOUND_S)
    assert_refused_everywhere(calls(stack, token), 403, "rollout_ended")
    # and the agent itself is stopped, within the lease keeper's check (2 s), long before its
    # next renewal (20 s with the default lease); found by its runtime's tag
    deadline = time.monotonic() + 10
    while tagged_pids(f"{rollout_id.hex}-1"):
        assert time.monotonic() < deadline, "the cancelled rollout's agent still runs"
        time.sleep(0.1)


def test_a_signed_token_of_an_unknown_rollout_is_refused(stack: LocalStack) -> None:
    token = issue_rollout_token(stack.settings.secret_key, uuid.uuid4(), 600)
    assert_refused_everywhere(calls(stack, token), 401, "unknown_rollout")
