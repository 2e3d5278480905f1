"""A token budget per rollout attempt: the completion tokens its agent may generate in total.

The job's `max_tokens_per_rollout` (capped by the tenant's quota at submit) bounds the whole
rollout, not one call. The proxy counts the **completion** tokens of the attempt's agent calls
(the tokens the policy generated, the ones a trainer trains on and the engine spends its decode
time on; prompts are re-sent every turn and bounded by the context already). Before forwarding a
call it clamps `max_tokens` (and `max_completion_tokens`) to what is left, and once nothing is
left it refuses the call with HTTP 400 `token_budget_exhausted` in the family's error shape: a 400
because the budget never comes back (SDKs retry a 429 in vain). The run-agent stage then ends the
rollout `token_budget`: an agent outcome like `max_turns`, scored, its trajectory usable.

Across proxy processes: what an attempt spent is read from the database rows every proxy wrote (one
query per calling rollout per `ttl_s`, not one per call; a job without a budget is read once per
attempt, or never when the attempt's token says it has none), plus this process's calls whose rows
its writer has not committed yet. Rows are written in submission order, so a call is counted locally
until the writer's processed-rows counter passes its ordinal (read right after each query). The
budget can be exceeded only by calls running at the same moment in different processes, or written
between a query's snapshot and that counter read: each of those was clamped to what was left when it
started.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select

from polar_mq.calls import calls_window
from polar_mq.capability.sampling import is_number
from polar_mq.capability.tokens import AGENT, RolloutClaim
from polar_mq.models import Job, LlmCall, Rollout
from polar_mq.proxy.rollout_states import Refusal
from polar_mq.proxy.sampling import TOKEN_FIELDS
from polar_mq.proxy.store.sink import CallSink, SinkWrapper

log = logging.getLogger(__name__)

EXHAUSTED = "token_budget_exhausted"
BUDGET_FIELD = "max_tokens_per_rollout"
"""The job spec's field (`JobCreate.max_tokens_per_rollout`)."""

Attempt = tuple[uuid.UUID, int]
BudgetReader = Callable[[uuid.UUID, int], tuple[int | None, int]]
"""(the attempt's budget or None, completion tokens its stored agent calls hold); blocking."""


def db_budget_reader(engine: Engine) -> BudgetReader:
    """Two small indexed queries: the job's budget, and the stored completion tokens (4 bytes
    per packed token id) of the attempt's agent calls."""

    def read(rollout_id: uuid.UUID, attempt: int) -> tuple[int | None, int]:
        with engine.connect() as conn:
            found = conn.execute(
                select(Job.spec, Rollout.created_at)
                .join(Rollout, Rollout.job_id == Job.id)
                .where(Rollout.id == rollout_id)
            ).first()
            spec = found.spec if found is not None else None
            created_at: datetime | None = found.created_at if found is not None else None
            budget = spec.get(BUDGET_FIELD) if isinstance(spec, dict) else None
            if not isinstance(budget, int):
                return None, 0
            used = conn.scalar(
                select(func.coalesce(func.sum(func.length(LlmCall.completion_ids)), 0)).where(
                    LlmCall.rollout_id == rollout_id,
                    LlmCall.attempt == attempt,
                    LlmCall.purpose == AGENT,
                    *calls_window(created_at, None),  # only the days the rollout lived in
                )
            )
        return budget, int(used or 0) // 4

    return read


def processed_rows(stats: dict[str, int]) -> int:
    """Rows the writer is done with, in submission order: written, or dropped or failed (never
    to be stored). Counting the lost ones keeps the ordinals of later rows aligned."""
    return stats.get("written", 0) + stats.get("dropped", 0) + stats.get("failed", 0)


@dataclass(slots=True)
class Account:
    """One attempt's budget as this process knows it (pure arithmetic, tested on its own)."""

    budget: int | None
    stored: int = 0
    """Completion tokens of the attempt's rows in the database at the last read."""
    unwritten: list[tuple[int, int]] = field(default_factory=list)
    """(writer ordinal, completion tokens) of this process's calls not in `stored` yet."""
    read_at: float = 0.0
    final: bool = False
    """Read, and without a budget: a job's budget never changes, so it is not read again."""

    @property
    def used(self) -> int:
        return self.stored + sum(tokens for _, tokens in self.unwritten)

    @property
    def left(self) -> int | None:
        return None if self.budget is None else max(0, self.budget - self.used)

    def spent(self, ordinal: int, tokens: int) -> None:
        self.unwritten.append((ordinal, tokens))

    def reread(self, budget: int | None, stored: int, written: int, now: float) -> None:
        """A fresh read: rows up to ordinal `written` are in the database, so in `stored`."""
        self.budget, self.stored, self.read_at = budget, stored, now
        self.unwritten = [(o, t) for o, t in self.unwritten if o > written]
        self.final = budget is None


def clamp_to_budget(body: dict[str, Any], left: int) -> dict[str, Any] | None:
    """`body` with its token limit(s) at most `left` (added when it has none); None if unchanged."""
    keys = [key for key in TOKEN_FIELDS if body.get(key) is not None] or ["max_tokens"]
    changes = {
        key: left
        for key in keys
        if not is_number(body.get(key)) or body[key] > left  # a non-number would be refused anyway
    }
    return {**body, **changes} if changes else None


class TokenBudgets:
    """The accounts of the attempts calling this process; `left` is asked on every call."""

    def __init__(
        self,
        read: BudgetReader,
        ttl_s: float,
        written: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
        max_accounts: int = 100_000,
    ) -> None:
        self.read = read
        self.ttl_s = ttl_s
        self.written = written
        self.clock = clock
        self.max_accounts = max_accounts
        self.ordinal = 0
        """Rows submitted to the writer so far (this process's row ordinals)."""
        self.queries = 0
        self._accounts: dict[Attempt, Account] = {}

    async def left(self, rollout_id: uuid.UUID, attempt: int) -> int | None:
        """Completion tokens the attempt may still generate (None: it has no budget)."""
        key = (rollout_id, attempt)
        account = self._accounts.get(key)
        now = self.clock()
        if account is None or (not account.final and now - account.read_at > self.ttl_s):
            account = await self._refresh(key, account)
        return account.left

    async def _refresh(self, key: Attempt, account: Account | None) -> Account:
        self.queries += 1
        try:
            budget, stored = await asyncio.to_thread(self.read, *key)
        except Exception as exc:  # keep serving on what is known; a blip must not fail agents
            log.warning("token budget of %s unreadable: %s", key[0], exc)
            if account is None:
                account = Account(None)
            account.read_at = self.clock()
            return account
        if account is None:
            if len(self._accounts) >= self.max_accounts:
                self._accounts.clear()  # the oldest attempts ended long ago; recount from rows
            account = self._accounts[key] = Account(budget)
        account.reread(budget, stored, self.written(), self.clock())
        return account

    def spent(self, row: dict[str, Any]) -> None:
        """A call row went to the writer: count its completion tokens to its attempt."""
        self.ordinal += 1
        if row.get("purpose", AGENT) != AGENT:
            return
        account = self._accounts.get((row["rollout_id"], row.get("attempt") or 1))
        tokens = len(row.get("completion_ids") or ())
        if account is not None and account.budget is not None and tokens:
            account.spent(self.ordinal, tokens)


class BudgetedSink(SinkWrapper):
    """The call writer, telling the budgets about each row it is given (same interface)."""

    def __init__(self, inner: CallSink, budgets_of: Callable[[], TokenBudgets | None]) -> None:
        super().__init__(inner)
        self.budgets_of = budgets_of

    def submit(self, row: dict[str, Any]) -> None:
        self.inner.submit(row)
        budgets = self.budgets_of()
        if budgets is not None:
            budgets.spent(row)


async def within_budget(
    budgets: TokenBudgets | None, claim: RolloutClaim, body: dict[str, Any]
) -> dict[str, Any] | Refusal:
    """The chat or completions request clamped to the attempt's budget, or the refusal.

    A token that says its job has no budget (`RolloutClaim.unbudgeted`, signed by the run-agent
    stage from the job's spec, which never changes) spares the attempt's first call the database
    read that would only find none."""
    if budgets is None or claim.purpose != AGENT or claim.unbudgeted:
        return body
    left = await budgets.left(claim.rollout_id, claim.attempt or 1)
    if left is None:
        return body
    if left <= 0:
        message = (
            f"rollout {claim.rollout_id} has spent its token budget (the job's "
            f"{BUDGET_FIELD}): no more completions for this rollout"
        )
        return Refusal(400, EXHAUSTED, message)
    return clamp_to_budget(body, left) or body
