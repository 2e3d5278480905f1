"""The arithmetic of the per-rollout token budget (`polar_mq.proxy.token_budget`).

The database is a fake reader here; the real proxy, engine and agent are in
tests/e2e/test_token_budget_e2e.py.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from polar_mq.capability.tokens import JUDGE, RolloutClaim
from polar_mq.proxy.rollout_states import Refusal
from polar_mq.proxy.token_budget import (
    EXHAUSTED,
    Account,
    TokenBudgets,
    clamp_to_budget,
    processed_rows,
    within_budget,
)

ROLLOUT = uuid.uuid4()


def test_account_counts_stored_rows_and_its_own_unwritten_calls() -> None:
    account = Account(100)
    account.reread(100, 30, written=0, now=0.0)  # 30 tokens written by other processes
    account.spent(1, 20)  # this process: row 1, not written yet
    account.spent(2, 10)
    assert (account.used, account.left) == (60, 40)
    # rows 1 and 2 are now in the database (stored counts them): never counted twice
    account.reread(100, 60, written=2, now=1.0)
    assert (account.used, account.left) == (60, 40)
    # row 3 written after the read's snapshot: counted locally until a read sees it
    account.spent(3, 50)
    account.reread(100, 60, written=2, now=2.0)
    assert (account.used, account.left) == (110, 0)  # never negative


def test_no_budget_means_no_limit() -> None:
    assert Account(None).left is None


@pytest.mark.parametrize(
    ("body", "left", "clamped"),
    [
        ({"max_tokens": 1000}, 40, {"max_tokens": 40}),
        ({"max_tokens": 10}, 40, None),  # already within
        ({}, 40, {"max_tokens": 40}),  # added when the agent sent none
        ({"max_completion_tokens": 500}, 40, {"max_completion_tokens": 40}),
        ({"max_tokens": 500, "max_completion_tokens": 5}, 40, {"max_tokens": 40}),
    ],
)
def test_clamp_to_budget(body: dict[str, int], left: int, clamped: dict[str, int] | None) -> None:
    out = clamp_to_budget({"messages": [], **body}, left)
    if clamped is None:
        assert out is None
    else:
        assert out == {"messages": [], **body, **clamped}


class FakeRows:
    """The database as the reader sees it: the budget and the stored completion tokens."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.stored = 0
        self.reads = 0

    def __call__(self, rollout_id: uuid.UUID, attempt: int) -> tuple[int | None, int]:
        self.reads += 1
        return self.budget, self.stored


def test_budgets_clamp_then_refuse_and_read_once_per_ttl() -> None:
    rows = FakeRows(50)
    clock = [0.0]
    written = [0]
    budgets = TokenBudgets(rows, ttl_s=2.0, written=lambda: written[0], clock=lambda: clock[0])
    claim = RolloutClaim(ROLLOUT, 2**40, attempt=1)

    async def scenario() -> None:
        first = await within_budget(budgets, claim, {"max_tokens": 1000})
        assert first == {"max_tokens": 50}
        budgets.spent({"rollout_id": ROLLOUT, "attempt": 1, "completion_ids": [1] * 30})
        second = await within_budget(budgets, claim, {"max_tokens": 1000})
        assert second == {"max_tokens": 20}
        assert rows.reads == 1  # within the ttl: no query per call
        # another process spent 15 tokens meanwhile; our row (ordinal 1) is written too
        rows.stored, written[0], clock[0] = 30 + 15, 1, 3.0
        third = await within_budget(budgets, claim, {"max_tokens": 1000})
        assert third == {"max_tokens": 5}
        budgets.spent({"rollout_id": ROLLOUT, "attempt": 1, "completion_ids": [1] * 5})
        refused = await within_budget(budgets, claim, {"max_tokens": 1000})
        assert isinstance(refused, Refusal)
        assert (refused.status, refused.code) == (400, EXHAUSTED)
        # a new attempt starts with the whole budget (its own rows only)
        rows.stored = 0
        again = await within_budget(budgets, RolloutClaim(ROLLOUT, 2**40, attempt=2), {})
        assert again == {"max_tokens": 50}

    asyncio.run(scenario())


def test_judge_calls_and_jobs_without_budget_are_never_limited() -> None:
    rows = FakeRows(None)
    clock = [0.0]
    budgets = TokenBudgets(rows, ttl_s=2.0, written=lambda: 0, clock=lambda: clock[0])
    body = {"max_tokens": 1000}

    async def scenario() -> None:
        assert await within_budget(budgets, RolloutClaim(ROLLOUT, 2**40), body) is body
        clock[0] = 100.0
        assert await within_budget(budgets, RolloutClaim(ROLLOUT, 2**40), body) is body
        assert rows.reads == 1  # no budget: never read again for this attempt
        judged = TokenBudgets(FakeRows(1), ttl_s=2.0, written=lambda: 0)
        judge = RolloutClaim(ROLLOUT, 2**40, purpose=JUDGE)
        assert await within_budget(judged, judge, body) is body
        assert judged.queries == 0

    asyncio.run(scenario())


def test_a_token_that_says_no_budget_is_never_looked_up() -> None:
    rows = FakeRows(5)  # a budget the proxy would enforce had it read it
    budgets = TokenBudgets(rows, ttl_s=2.0, written=lambda: 0)
    body = {"max_tokens": 1000}
    unbudgeted = RolloutClaim(ROLLOUT, 2**40, attempt=1, unbudgeted=True)

    async def scenario() -> None:
        assert await within_budget(budgets, unbudgeted, body) is body
        assert (rows.reads, budgets.queries) == (0, 0)
        # the same attempt without the mark (an older issuer's token) is read and clamped
        clamped = await within_budget(budgets, RolloutClaim(ROLLOUT, 2**40, attempt=1), body)
        assert clamped == {"max_tokens": 5}
        assert rows.reads == 1

    asyncio.run(scenario())


def test_unreadable_database_serves_without_a_budget_and_retries() -> None:
    rows = FakeRows(10)
    down = [True]

    def flaky(rollout_id: uuid.UUID, attempt: int) -> tuple[int | None, int]:
        if down[0]:
            raise OSError("database down")
        return rows(rollout_id, attempt)

    clock = [0.0]
    budgets = TokenBudgets(flaky, ttl_s=2.0, written=lambda: 0, clock=lambda: clock[0])
    assert asyncio.run(budgets.left(ROLLOUT, 1)) is None
    down[0], clock[0] = False, 3.0
    assert asyncio.run(budgets.left(ROLLOUT, 1)) == 10  # read again once the period passed


def test_processed_rows_count_lost_rows_to_keep_ordinals_aligned() -> None:
    assert processed_rows({"written": 5, "dropped": 2, "failed": 1, "queued": 9}) == 8
    assert processed_rows({"written": 3}) == 3
