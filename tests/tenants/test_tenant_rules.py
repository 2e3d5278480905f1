"""Scopes, tenant names and the precedence of quota limits (Settings < tenant < key)."""

from __future__ import annotations

import pytest

from polar_mq.api.auth import ANONYMOUS, Principal
from polar_mq.config import QuotaLimits, Settings
from polar_mq.jobs.schemas import JobCreate
from polar_mq.tenants.quotas import tenant_quota, with_token_limit
from polar_mq.tenants.scopes import ALL_SCOPES, check_tenant, parse_scopes


def test_parse_scopes_is_canonical_and_strict() -> None:
    assert parse_scopes("jobs:write, jobs:read,jobs:write") == ("jobs:read", "jobs:write")
    assert parse_scopes(ALL_SCOPES) == ALL_SCOPES
    for bad, message in ((" ,", "at least one"), ("jobs:*", "unknown scope"), ("", "at least")):
        with pytest.raises(ValueError, match=message):
            parse_scopes(bad)


@pytest.mark.parametrize("name", ["", " a", "a b", "x" * 65, "a\x00", "../a", "-a"])
def test_bad_tenant_names(name: str) -> None:
    with pytest.raises(ValueError, match="invalid tenant"):
        check_tenant(name)


def test_admin_sees_every_tenant_and_holds_every_scope() -> None:
    admin = Principal("ops", 1, tenant="ops", scopes=frozenset({"admin"}))
    reader = Principal("r", 2, tenant="a", scopes=frozenset({"jobs:read"}))
    assert admin.visible_tenant is None and admin.can("policy:write")
    assert reader.visible_tenant == "a" and not reader.can("jobs:write")
    assert ANONYMOUS.is_admin and ANONYMOUS.tenant == "admin"  # development mode, no keys


def test_quota_precedence() -> None:
    settings = Settings.model_validate(
        {
            "quota_max_rollouts_per_request": 100,
            "quota_max_rollouts_in_flight": 1000,
            "tenant_quotas": {"a": {"max_rollouts_in_flight": 50, "max_tokens_per_rollout": 64}},
        }
    )
    assert tenant_quota(settings, "b") == QuotaLimits(
        max_rollouts_per_request=100, max_rollouts_in_flight=1000
    )
    assert tenant_quota(settings, "a") == QuotaLimits(
        max_rollouts_per_request=100, max_rollouts_in_flight=50, max_tokens_per_rollout=64
    )
    key = QuotaLimits(max_rollouts_per_request=5, max_tokens_per_rollout=128)
    assert tenant_quota(settings, "a", key) == QuotaLimits(
        max_rollouts_per_request=5, max_rollouts_in_flight=50, max_tokens_per_rollout=128
    )


@pytest.mark.parametrize(
    "limits",
    [{"max_rollout": 1}, {"max_rollouts_in_flight": "5"}, {"max_rollouts_in_flight": 0}],
)
def test_tenant_quotas_refuse_unknown_or_loose_values(limits: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Settings.model_validate({"tenant_quotas": {"a": limits}})


def test_token_limit_fills_only_a_missing_budget() -> None:
    spec = JobCreate.model_validate({"tasks": [{"instruction": "x"}]})
    assert with_token_limit(spec, None) is spec
    assert with_token_limit(spec, 64).sampling == {"max_tokens": 64}
    own = JobCreate.model_validate({"tasks": [{"instruction": "x"}], "sampling": {"max_tokens": 8}})
    assert with_token_limit(own, 64).sampling == {"max_tokens": 8}
    assert with_token_limit(spec, 64).max_tokens_per_rollout == 64  # the rollout's budget too
    budgeted = JobCreate.model_validate(
        {"tasks": [{"instruction": "x"}], "max_tokens_per_rollout": 32}
    )
    assert with_token_limit(budgeted, 64).max_tokens_per_rollout == 32
    with pytest.raises(ValueError):  # strict: no "32" or true
        JobCreate.model_validate({"tasks": [{"instruction": "x"}], "max_tokens_per_rollout": "32"})
