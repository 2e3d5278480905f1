"""Rollout tokens: purposes are signed, agent tokens keep their original format."""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polar_mq.proxy.auth import RolloutAuth
from polar_mq.tokens import (
    AGENT,
    JUDGE,
    InvalidToken,
    RolloutClaim,
    issue_rollout_token,
    verify_rollout_token,
)

SECRET = "token-test-secret"
ROLLOUT = uuid.UUID("12345678-1234-5678-1234-567812345678")


def signed(payload: str, secret: str = SECRET) -> str:
    """A token as an issuer would write it, computed independently of polar_mq.tokens."""
    digest = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{payload}_{digest}"


@pytest.mark.parametrize("purpose", [AGENT, JUDGE])
def test_round_trip(purpose: str) -> None:
    before = int(time.time())
    token = issue_rollout_token(SECRET, ROLLOUT, 600, purpose=purpose)
    claim = verify_rollout_token(SECRET, token)
    assert claim.rollout_id == ROLLOUT
    assert claim.purpose == purpose
    assert before + 600 <= claim.expires_at <= int(time.time()) + 600


def test_agent_tokens_keep_the_original_format() -> None:
    expires = int(time.time()) + 600
    legacy = signed(f"pmq_{ROLLOUT.hex}_{expires}")  # as issued before purposes existed
    assert verify_rollout_token(SECRET, legacy) == RolloutClaim(ROLLOUT, expires, AGENT)
    assert issue_rollout_token(SECRET, ROLLOUT, 600).count("_") == 3
    judge = issue_rollout_token(SECRET, ROLLOUT, 600, purpose=JUDGE)
    assert judge.split("_")[3] == "judge"


def test_purpose_cannot_be_added_or_removed() -> None:
    agent = issue_rollout_token(SECRET, ROLLOUT, 600)
    payload, signature = agent.rsplit("_", 1)
    with pytest.raises(InvalidToken, match="signature"):
        verify_rollout_token(SECRET, f"{payload}_judge_{signature}")
    judge = issue_rollout_token(SECRET, ROLLOUT, 600, purpose=JUDGE)
    parts = judge.split("_")
    with pytest.raises(InvalidToken, match="signature"):
        verify_rollout_token(SECRET, "_".join([*parts[:3], parts[4]]))


@pytest.mark.parametrize("purpose", ["agent", "trainer", "", "JUDGE"])
def test_signed_but_unknown_or_redundant_purposes_are_refused(purpose: str) -> None:
    token = signed(f"pmq_{ROLLOUT.hex}_{int(time.time()) + 600}_{purpose}")
    with pytest.raises(InvalidToken, match="malformed"):
        verify_rollout_token(SECRET, token)


def test_issuing_an_unknown_purpose_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown token purpose 'trainer'"):
        issue_rollout_token(SECRET, ROLLOUT, 600, purpose="trainer")


@pytest.mark.parametrize("purpose", [AGENT, JUDGE])
def test_expiry_and_secret_apply_to_every_purpose(purpose: str) -> None:
    expired = issue_rollout_token(SECRET, ROLLOUT, -5, purpose=purpose)
    with pytest.raises(InvalidToken, match="expired"):
        verify_rollout_token(SECRET, expired)
    with pytest.raises(InvalidToken, match="signature"):
        verify_rollout_token("other", issue_rollout_token(SECRET, ROLLOUT, 60, purpose=purpose))


def test_the_proxy_auth_resolves_the_purpose() -> None:
    auth = RolloutAuth(SECRET)
    judge = issue_rollout_token(SECRET, ROLLOUT, 600, purpose=JUDGE)
    agent = issue_rollout_token(SECRET, ROLLOUT, 600)
    assert auth.verify(judge).purpose == JUDGE
    assert auth.verify(judge).purpose == JUDGE  # from the cache
    assert auth.verify(agent).purpose == AGENT


@given(st.text(alphabet="pmq_0123456789abcdefjudgent", max_size=120))
def test_garbage_is_only_ever_an_invalid_token(token: str) -> None:
    with pytest.raises(InvalidToken):
        verify_rollout_token(SECRET, token)


def test_attempt_is_signed_and_round_trips() -> None:
    rollout = uuid.uuid4()
    token = issue_rollout_token("s3cret", rollout, 60, attempt=3)
    claim = verify_rollout_token("s3cret", token)
    assert (claim.rollout_id, claim.purpose, claim.attempt) == (rollout, "agent", 3)
    forged = token.replace("_agent_3_", "_agent_4_")
    assert forged != token
    with pytest.raises(InvalidToken):
        verify_rollout_token("s3cret", forged)
    judge = verify_rollout_token("s3cret", issue_rollout_token("s3cret", rollout, 60, "judge", 2))
    assert (judge.purpose, judge.attempt) == ("judge", 2)
    plain = issue_rollout_token("s3cret", rollout, 60)
    assert verify_rollout_token("s3cret", plain).attempt is None
    with pytest.raises(ValueError):
        issue_rollout_token("s3cret", rollout, 60, attempt=0)
