"""The exactly-once ledger of a fault run: what the database and the hosts must show at the end.

Used by the multi-host tests and the chaos soak (which reports it rather than stopping at the
first problem, so `check` returns a list of problems instead of asserting):

- every accepted rollout is in exactly one terminal state, reached by exactly one terminal event;
- one evaluation per completed rollout, none for the others;
- a completed rollout's final attempt has one sample per answered call of that attempt (the
  `per_call` builder), and no sample is of an attempt later than the final one; samples an
  earlier attempt built before it was restarted stay in the table, never served (counted);
- every call an agent saw answered (its call log: `<rollout id> <response id>` lines) is stored
  exactly once, and no stored call is stored twice;
- no runtime directory or tagged runtime process is left under any host's runtime root.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.models import (
    Evaluation,
    Event,
    EventKind,
    LlmCall,
    Rollout,
    RolloutStatus,
    TrajectorySample,
)
from polar_mq.workers.janitor import local_runtime_ids


@dataclass
class Ledger:
    rollouts: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    attempts: Counter[int] = field(default_factory=Counter)
    stale_samples: int = 0
    """Samples of attempts that were later restarted: kept, never served (the results and
    trajectory queries join on the rollout's final attempt)."""
    calls_seen: int = 0
    calls_stored: int = 0
    leftovers: dict[str, set[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.rollouts} rollouts {dict(self.statuses)}, attempts {dict(self.attempts)}, "
            f"calls seen {self.calls_seen} stored {self.calls_stored}, "
            f"{self.stale_samples} samples of restarted attempts (not served), "
            f"{len(self.problems)} problems"
        )


def seen_calls(call_log: Path) -> list[tuple[str, str]]:
    """The calls agents saw answered, from their log files (`*.txt` under `call_log`)."""
    seen = []
    for path in call_log.glob("*.txt"):
        for line in path.read_text().splitlines():
            if len(parts := line.split()) == 2:
                seen.append((parts[0], parts[1]))
    return seen


def check(
    factory: sessionmaker[Session],
    rollout_ids: Iterable[str],
    call_log: Path,
    runtime_roots: Iterable[Path] = (),
) -> Ledger:
    ids = [uuid.UUID(r) for r in rollout_ids]
    ledger = Ledger(rollouts=len(ids))
    with factory() as session:
        rows = _Rows.read(session, ids)
    if len(rows.rollouts) != len(ids):
        ledger.problems.append(f"{len(ids) - len(rows.rollouts)} accepted rollouts missing")
    _check_rollouts(ledger, rows)
    _check_calls(ledger, rows, call_log)
    for root in runtime_roots:
        if left := local_runtime_ids(root):
            ledger.leftovers[str(root)] = left
            ledger.problems.append(f"{root}: runtimes left {sorted(left)}")
    return ledger


@dataclass
class _Rows:
    rollouts: dict[str, Rollout]
    events: list[Any]
    evaluations: Counter[str]
    samples: list[Any]
    calls: list[Any]

    @classmethod
    def read(cls, session: Session, ids: list[uuid.UUID]) -> _Rows:
        rollouts = session.scalars(select(Rollout).where(Rollout.id.in_(ids)))
        events = session.execute(
            select(Event.rollout_id, Event.kind, Event.stage).where(Event.rollout_id.in_(ids))
        ).all()
        evaluations = session.scalars(
            select(Evaluation.rollout_id).where(Evaluation.rollout_id.in_(ids))
        )
        samples = session.execute(
            select(TrajectorySample.rollout_id, TrajectorySample.attempt, func.count())
            .where(TrajectorySample.rollout_id.in_(ids))
            .group_by(TrajectorySample.rollout_id, TrajectorySample.attempt)
        ).all()
        calls = session.execute(
            select(
                LlmCall.rollout_id, LlmCall.response, LlmCall.attempt, LlmCall.status_code
            ).where(LlmCall.rollout_id.in_(ids))
        ).all()
        return cls(
            {str(r.id): r for r in rollouts}, list(events), Counter(str(r) for r in evaluations),
            list(samples), list(calls),
        )  # fmt: skip


def _check_rollouts(ledger: Ledger, rows: _Rows) -> None:
    """One terminal state and event each, one evaluation per completed rollout, one sample per
    answered call of the final attempt."""
    rollouts, problems = rows.rollouts, ledger.problems
    ends = Counter(
        str(e.rollout_id)
        for e in rows.events
        if e.kind in (EventKind.FAILED, EventKind.CANCELLED)
        or (e.kind == EventKind.FINISHED and e.stage == "evaluate")
    )
    final_ok: Counter[str] = Counter()
    for c in rows.calls:
        rollout = rollouts.get(str(c.rollout_id))
        if rollout is not None and c.attempt == rollout.attempt and c.status_code == 200:
            final_ok[str(c.rollout_id)] += 1
    final_samples: Counter[str] = Counter()
    for row in rows.samples:
        rid = str(row.rollout_id)
        if rid not in rollouts:
            continue
        if row.attempt == rollouts[rid].attempt:
            final_samples[rid] += row[2]
        elif row.attempt < rollouts[rid].attempt:
            ledger.stale_samples += row[2]
        else:
            problems.append(f"{rid}: samples of attempt {row.attempt} > {rollouts[rid].attempt}")
    for rid, rollout in rollouts.items():
        ledger.statuses[rollout.status] += 1
        ledger.attempts[rollout.attempt] += 1
        if rollout.status not in RolloutStatus.TERMINAL:
            problems.append(f"{rid}: not terminal ({rollout.status})")
        if ends[rid] != 1:
            problems.append(f"{rid}: {ends[rid]} terminal events")
        completed = rollout.status == RolloutStatus.COMPLETED
        if rows.evaluations[rid] != int(completed):
            problems.append(f"{rid}: {rows.evaluations[rid]} evaluations ({rollout.status})")
        if completed and final_samples[rid] != final_ok[rid]:
            problems.append(f"{rid}: {final_samples[rid]} samples, {final_ok[rid]} final calls")


def _check_calls(ledger: Ledger, rows: _Rows, call_log: Path) -> None:
    """Every call an agent saw answered is stored once; no call is stored twice."""
    stored = Counter((str(c.rollout_id), (c.response or {}).get("id")) for c in rows.calls)
    ledger.calls_stored = sum(1 for key in stored if key[1] is not None)
    ledger.problems += [f"{k}: stored {n} times" for k, n in stored.items() if k[1] and n > 1]
    seen = seen_calls(call_log)
    ledger.calls_seen = len(seen)
    ledger.problems += [f"{call}: seen, not stored" for call in seen if stored[call] != 1]
