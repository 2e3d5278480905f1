"""`polar-mq db ...`: the database schema (an operator's action on POLAR_MQ_DATABASE_URL)."""

from __future__ import annotations

import typer

from polar_mq.cli.common import console, load_settings

db_app = typer.Typer(no_args_is_help=True, help="Database schema.")


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply the Alembic migrations to POLAR_MQ_DATABASE_URL."""
    from polar_mq.migrate import upgrade

    settings = load_settings()
    upgrade(settings.database_url, revision)
    console.print(f"database at revision {revision}")
