"""`polar-mq db ...`: the database schema (an operator's action on POLAR_MQ_DATABASE_URL)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from polar_mq.cli.common import console, fail, load_settings

db_app = typer.Typer(no_args_is_help=True, help="Database schema and call retention.")


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply the Alembic migrations to POLAR_MQ_DATABASE_URL."""
    from polar_mq.infra.migrate import upgrade

    settings = load_settings()
    upgrade(settings.database_url, revision)
    console.print(f"database at revision {revision}")


@db_app.command("prune")
def db_prune(
    older_than: Annotated[
        str, typer.Option("--older-than", help="age of the calls to delete: 30d, 12h, 2w")
    ],
    export: Annotated[
        Path | None,
        typer.Option("--export", help="write the deleted calls here first (JSONL.gz per day)"),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="count what would be deleted; delete nothing")
    ] = False,
) -> None:
    """Delete LLM calls older than an age (whole days dropped), keeping running jobs' calls."""
    from polar_mq.infra.db import create_db_engine
    from polar_mq.models.base import utcnow
    from polar_mq.retention.age import BadAge, parse_age
    from polar_mq.retention.prune import prune

    try:
        age = parse_age(older_than)
    except BadAge as exc:
        raise fail(f"--older-than: {exc}", 2) from None
    settings = load_settings()
    engine = create_db_engine(settings.database_url)
    try:
        report = prune(engine, utcnow() - age, export_dir=export, dry_run=dry_run)
    finally:
        engine.dispose()
    data = asdict(report)
    data["cutoff"] = report.cutoff.isoformat()
    console.print_json(data=data)
