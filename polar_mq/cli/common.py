"""What every `polar-mq` command module shares: the console, settings, failing with a message."""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError
from rich.console import Console

from polar_mq.config import Settings, describe_config_error, get_settings
from polar_mq.config.credentials import credential_warnings

console = Console()
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def load_settings() -> Settings:
    """The process settings, or exit 2 with one line saying what to fix (never a traceback)."""
    try:
        settings = get_settings()
    except ValidationError as exc:
        _config_error(describe_config_error(exc))
        raise typer.Exit(2) from None
    except Exception as exc:  # e.g. a list setting that is not valid JSON
        _config_error(f"{type(exc).__name__}: {exc}")
        raise typer.Exit(2) from None
    for warning in credential_warnings(settings):  # production: a server open without password
        sys.stderr.write(f"warning: {warning}\n")
    return settings


def _config_error(message: str) -> None:
    # Plain stderr, no markup or wrapping: the whole reason stays on one line for logs and tests.
    sys.stderr.write(f"configuration error: {' '.join(message.split())}\n")


def fail(message: str, code: int = 1, *, to: Console = console) -> typer.Exit:
    """Print `error: message` (on `to`) and return the exit to raise."""
    to.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)
