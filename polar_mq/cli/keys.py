"""`polar-mq keys`: create, list and revoke REST API keys, straight in the database.

It talks to the database of POLAR_MQ_DATABASE_URL (an operator's action, not an API call: no key
is needed to make the first).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from polar_mq.cli.common import fail
from polar_mq.config import get_settings
from polar_mq.tenants.scopes import ALL_SCOPES

if TYPE_CHECKING:  # the ORM is imported when a command opens a session, not at every start of
    from sqlalchemy.orm import Session  # the CLI (`polar-mq status` has no use for it)

keys_app = typer.Typer(no_args_is_help=True, help="REST API keys (tenant, scopes, quotas).")
console = Console(stderr=True)

Limit = Annotated[int | None, typer.Option(min=1, help="overrides the tenant's quota")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    return fail(message, code, to=console)


@contextmanager
def _session() -> Iterator[Session]:
    from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work

    try:
        settings = get_settings()
    except Exception as exc:  # pydantic ValidationError: a message, not a traceback
        raise _fail(f"configuration error: {exc}") from exc
    engine = create_db_engine(settings.database_url)
    try:
        with unit_of_work(make_session_factory(engine)) as session:
            yield session
    finally:
        engine.dispose()


@keys_app.command("create")
def keys_create(
    name: str,
    tenant: Annotated[str, typer.Option(help="owner of the key and of the jobs it submits")],
    scopes: Annotated[str, typer.Option(help=f"comma-separated: {', '.join(ALL_SCOPES)}")],
    max_rollouts_per_request: Limit = None,
    max_rollouts_in_flight: Limit = None,
    max_tokens_per_rollout: Limit = None,
) -> None:
    """Create an API key; it is printed once (alone on stdout) and only its hash is stored."""
    from polar_mq.config import QuotaLimits
    from polar_mq.tenants.keys import create_api_key

    quota = QuotaLimits(
        max_rollouts_per_request=max_rollouts_per_request,
        max_rollouts_in_flight=max_rollouts_in_flight,
        max_tokens_per_rollout=max_tokens_per_rollout,
    )
    try:
        with _session() as session:
            key = create_api_key(session, name, tenant=tenant, scopes=scopes, quota=quota)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    print(key)
    console.print(f"key {name!r} for tenant {tenant!r} created; it is not shown again")


@keys_app.command("list")
def keys_list(
    all_: Annotated[bool, typer.Option("--all", help="also revoked keys")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
) -> None:
    """The keys (never the keys themselves: only their hashes are stored)."""
    from polar_mq.tenants.keys import list_api_keys

    with _session() as session:
        keys = list_api_keys(session, include_revoked=all_)
    rows: list[dict[str, Any]] = [
        {
            "id": k.id,
            "name": k.name,
            "tenant": k.tenant,
            "scopes": list(k.scopes),
            "quota": k.quota.model_dump(exclude_none=True),
            "created_at": k.created_at.isoformat(),
            "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
        }
        for k in keys
    ]
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    header = ("id", "name", "tenant", "scopes", "quota", "created", "revoked")
    lines = [header] + [
        (
            str(row["id"]),
            row["name"],
            row["tenant"],
            ",".join(row["scopes"]),
            ", ".join(f"{k}={v}" for k, v in row["quota"].items()) or "-",
            row["created_at"][:19],
            (row["revoked_at"] or "-")[:19],
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:  # plain columns: never truncated, whatever the terminal width
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )


@keys_app.command("revoke")
def keys_revoke(
    name_or_id: Annotated[str, typer.Argument(metavar="NAME|ID", help="a name or an id")],
) -> None:
    """Revoke a key by id, or every active key with that name; at once for every API process."""
    from polar_mq.tenants.keys import revoke_api_key

    with _session() as session:
        revoked = revoke_api_key(session, name_or_id)
    if not revoked:
        raise _fail(f"no active key with id or name {name_or_id!r}", 1)
    console.print(f"revoked {revoked} key{'s' if revoked != 1 else ''}")
