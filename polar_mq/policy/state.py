"""The current policy version, as the trainer declared it, in one row of `policy_state`.

Versions only go forward: a trainer that retries an update with the same version is answered as
if it were the first call; an older version is a conflict (a second trainer, or a restarted one
that lost count) and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from polar_mq.infra.errors import PolarError
from polar_mq.models import DEFAULT_POLICY, PolicyState
from polar_mq.models.base import utcnow
from polar_mq.policy.weights import Adapter


class VersionWentBack(PolarError):
    """A policy version lower than the current one (the API answers 409)."""

    status = 409
    type = "policy_version_went_back"


class AdapterChanged(VersionWentBack):
    """The current version republished with another adapter (409): the engines already hold an
    adapter of that version's name, and would keep serving it, so new weights need a new version."""


@dataclass(frozen=True, slots=True)
class PolicyView:
    version: int
    paused: bool
    updated_at: datetime | None
    """None while no version was ever set (version 0, never paused)."""
    adapter: Adapter | None = None
    """The LoRA adapter the engines serve this version with; None: the base weights."""


def _adapter(row: PolicyState) -> Adapter | None:
    if row.adapter_name is None or row.adapter_path is None:
        return None
    return Adapter(row.adapter_name, row.adapter_path)


def current_policy(session: Session, name: str = DEFAULT_POLICY) -> PolicyView:
    row = session.get(PolicyState, name)
    if row is None:
        return PolicyView(0, False, None)
    return PolicyView(row.version, row.paused, row.updated_at, _adapter(row))


def current_version(session: Session, name: str = DEFAULT_POLICY) -> int:
    return int(session.scalar(select(PolicyState.version).where(PolicyState.name == name)) or 0)


def write_policy(
    session: Session,
    *,
    version: int | None = None,
    paused: bool | None = None,
    adapter: Adapter | None = None,
    name: str = DEFAULT_POLICY,
) -> tuple[PolicyView, PolicyView]:
    """Set the version, the pause flag and/or the adapter (None: unchanged); (before, after).
    Raises VersionWentBack.

    The row is locked for the rest of the transaction, so two concurrent updates serialise and
    the monotonic check cannot be raced.
    """
    row = session.scalars(
        select(PolicyState).where(PolicyState.name == name).with_for_update()
    ).one_or_none()
    if row is None:
        row = PolicyState(name=name, version=0, paused=False, updated_at=utcnow())
        session.add(row)
        session.flush()
        before = PolicyView(0, False, None)
    else:
        before = PolicyView(row.version, row.paused, row.updated_at, _adapter(row))
    if version is not None:
        if version < row.version:
            raise VersionWentBack(
                f"policy version {version} is older than the current version {row.version}"
                " (versions only go forward)"
            )
        if (  # this version's weights (a LoRA's or a checkpoint's name ends in -v{version})
            adapter is not None
            and row.adapter_name is not None
            and row.adapter_name.endswith(f"-v{version}")
            and (row.adapter_name, row.adapter_path) != (adapter.name, adapter.path)
        ):
            raise AdapterChanged(
                f"policy version {version} was published with the weights {row.adapter_path!r};"
                " publish new weights as a new version"
            )
        row.version = version
    if paused is not None:
        row.paused = paused
    if adapter is not None:
        row.adapter_name, row.adapter_path = adapter.name, adapter.path
    row.updated_at = utcnow()
    session.flush()
    return before, PolicyView(row.version, row.paused, row.updated_at, _adapter(row))
