"""Rollout tokens: purposes, attempts and sampling policies are signed; agent tokens keep their
original format."""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polar_mq.capability.sampling import SamplingPolicy, SamplingRule
from polar_mq.capability.tokens import (
    AGENT,
    JUDGE,
    InvalidToken,
    RolloutClaim,
    encode_policy,
    issue_rollout_token,
    verify_rollout_token,
)
from polar_mq.proxy.server.auth import RolloutAuth
from polar_mq.spec import TimeoutSpec

SECRET = "token-test-secret"
ROLLOUT = uuid.UUID("12345678-1234-5678-1234-567812345678")


def signed(payload: str, secret: str = SECRET) -> str:
    """A token as an issuer would write it, computed independently of polar_mq.capability.tokens."""
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


@pytest.mark.parametrize("receipts", [False, True])
@pytest.mark.parametrize("sampling", [None, "policy"])
def test_the_no_budget_mark_is_signed_into_the_attempt(
    receipts: bool, sampling: str | None
) -> None:
    policy = POLICY if sampling else None
    token = issue_rollout_token(
        SECRET, ROLLOUT, 60, attempt=2, receipts=receipts, sampling=policy, unbudgeted=True
    )
    claim = verify_rollout_token(SECRET, token)
    assert (claim.attempt, claim.receipts, claim.unbudgeted) == (2, receipts, True)
    segment = "2rn" if receipts else "2n"
    assert f"_agent_{segment}_" in token
    forged = token.replace(f"_{segment}_", "_2r_" if receipts else "_2_")
    with pytest.raises(InvalidToken):  # dropping the mark is a forgery like any other
        verify_rollout_token(SECRET, forged)
    plain = verify_rollout_token(SECRET, issue_rollout_token(SECRET, ROLLOUT, 60, attempt=2))
    assert plain.unbudgeted is False
    # signed, but in an order or repetition this issuer never writes: malformed
    for odd in ("2nr", "2nn", "2rr", "n", "rn"):
        with pytest.raises(InvalidToken):
            verify_rollout_token(SECRET, signed(f"pmq_{ROLLOUT.hex}_9999999999_agent_{odd}"))
    with pytest.raises(ValueError):
        issue_rollout_token(SECRET, ROLLOUT, 60, unbudgeted=True)  # the mark needs an attempt


@pytest.mark.parametrize("sampling", [None, "policy"])
def test_call_receipts_are_signed_into_the_attempt(sampling: str | None) -> None:
    policy = POLICY if sampling else None
    token = issue_rollout_token(SECRET, ROLLOUT, 60, attempt=2, receipts=True, sampling=policy)
    claim = verify_rollout_token(SECRET, token)
    assert (claim.attempt, claim.receipts, claim.sampling) == (2, True, policy)
    assert "_agent_2r_" in token
    for forged in (token.replace("_2r_", "_2_"), token.replace("_2r_", "_3r_")):
        with pytest.raises(InvalidToken):  # dropping the mark is a forgery like any other
            verify_rollout_token(SECRET, forged)
    plain = verify_rollout_token(SECRET, issue_rollout_token(SECRET, ROLLOUT, 60, attempt=2))
    assert plain.receipts is False
    # an issuer's own `2r` parses; a bare mark without an attempt is malformed
    assert verify_rollout_token(SECRET, signed(f"pmq_{ROLLOUT.hex}_9999999999_agent_2r")).receipts
    with pytest.raises(InvalidToken):
        verify_rollout_token(SECRET, signed(f"pmq_{ROLLOUT.hex}_9999999999_agent_r"))
    with pytest.raises(ValueError):
        issue_rollout_token(SECRET, ROLLOUT, 60, receipts=True)  # receipts are per attempt


POLICY = SamplingPolicy(
    (SamplingRule("temperature", "override", 0.9), SamplingRule("max_tokens", "clamp", 64))
)


@pytest.mark.parametrize("attempt", [None, 2])
@pytest.mark.parametrize("purpose", [AGENT, JUDGE])
def test_a_sampling_policy_is_signed_and_round_trips(purpose: str, attempt: int | None) -> None:
    token = issue_rollout_token(SECRET, ROLLOUT, 600, purpose, attempt, sampling=POLICY)
    claim = verify_rollout_token(SECRET, token)
    assert (claim.purpose, claim.attempt, claim.sampling) == (purpose, attempt, POLICY)
    assert claim.sampling is not None and claim.sampling.as_dict() == {
        "temperature": ["override", 0.9],
        "max_tokens": ["clamp", 64],
    }
    assert token.count("_") == 6 and len(token) < 200
    assert RolloutAuth(SECRET).verify(token).sampling == POLICY


@pytest.mark.parametrize("rules", [(), POLICY.rules])
def test_an_exact_policy_is_signed_and_round_trips(rules: tuple[SamplingRule, ...]) -> None:
    exact = SamplingPolicy(rules, exact=True)
    token = issue_rollout_token(SECRET, ROLLOUT, 600, attempt=2, sampling=exact)
    claim = verify_rollout_token(SECRET, token)
    assert claim.sampling == exact and claim.sampling.exact
    parts = token.split("_")
    loose = encode_policy(SamplingPolicy(rules))  # `exact` dropped: no longer what was signed
    with pytest.raises(InvalidToken, match="signature"):
        verify_rollout_token(SECRET, "_".join([*parts[:5], loose, parts[6]]))


def test_tokens_without_a_policy_keep_their_format() -> None:
    for policy in (None, SamplingPolicy()):
        plain = issue_rollout_token(SECRET, ROLLOUT, 600, sampling=policy)
        assert plain.count("_") == 3
        assert verify_rollout_token(SECRET, plain).sampling is None
        with_attempt = issue_rollout_token(SECRET, ROLLOUT, 600, attempt=1, sampling=policy)
        assert with_attempt.count("_") == 5
    expires = int(time.time()) + 600
    legacy = signed(f"pmq_{ROLLOUT.hex}_{expires}_agent_3")  # as issued before policies existed
    assert verify_rollout_token(SECRET, legacy) == RolloutClaim(ROLLOUT, expires, AGENT, 3)


def test_the_policy_segment_cannot_be_changed_added_or_removed() -> None:
    token = issue_rollout_token(SECRET, ROLLOUT, 600, attempt=1, sampling=POLICY)
    parts = token.split("_")
    looser = encode_policy(SamplingPolicy((SamplingRule("max_tokens", "clamp", 32000),)))
    with pytest.raises(InvalidToken, match="signature"):
        verify_rollout_token(SECRET, "_".join([*parts[:5], looser, parts[6]]))
    with pytest.raises(InvalidToken, match="signature"):  # dropped: the old 6-part format
        verify_rollout_token(SECRET, "_".join([*parts[:5], parts[6]]))
    plain = issue_rollout_token(SECRET, ROLLOUT, 600, attempt=1).split("_")
    with pytest.raises(InvalidToken, match="signature"):  # added to a token issued without one
        verify_rollout_token(SECRET, "_".join([*plain[:5], parts[5], plain[5]]))


@pytest.mark.parametrize(
    "segment",
    [
        "zz",
        b"[1]".hex(),
        b"{}".hex(),
        b'{"q":["o",1]}'.hex(),
        b'{"x":["o",2]}'.hex(),
        b'{"x":true}'.hex(),
        b'{"t":["x",1]}'.hex(),
        b'{"t":["o","1"]}'.hex(),
        b'{"t":["o",true]}'.hex(),
        b'{"t":["o"]}'.hex(),
    ],
)
def test_signed_but_unreadable_policies_are_refused(segment: str) -> None:
    token = signed(f"pmq_{ROLLOUT.hex}_{int(time.time()) + 600}_agent_1_{segment}")
    with pytest.raises(InvalidToken, match="malformed"):
        verify_rollout_token(SECRET, token)
    assert (
        verify_rollout_token(
            SECRET,
            signed(f"pmq_{ROLLOUT.hex}_{int(time.time()) + 600}_agent__{encode_policy(POLICY)}"),
        ).sampling
        == POLICY
    )


def test_agent_tokens_live_as_long_as_the_rollouts_time_limits() -> None:
    from polar_mq.config import TOKEN_GRACE_S, Settings

    settings = Settings(max_agent_timeout_s=3600, default_agent_timeout_s=600)
    assert settings.agent_token_ttl_s(TimeoutSpec(agent_s=30)) == 30 + TOKEN_GRACE_S
    assert settings.agent_token_ttl_s(TimeoutSpec()) == 600 + TOKEN_GRACE_S
    both = TimeoutSpec(agent_s=900, rollout_s=100.5)
    assert settings.agent_token_ttl_s(both) == 101 + TOKEN_GRACE_S
    assert settings.agent_token_ttl_s(TimeoutSpec(agent_s=99999)) == 3600 + TOKEN_GRACE_S
    capped = Settings(rollout_token_ttl_s=300)
    # the setting stays the upper bound
    assert capped.agent_token_ttl_s(TimeoutSpec(agent_s=600)) == 300
