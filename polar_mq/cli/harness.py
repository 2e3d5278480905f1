"""`polar-mq harness ...`: install the preset harnesses on this node and list what is installed.

Rollouts never download anything: a node installs its presets once (`harness install`), into
`POLAR_MQ_HARNESS_ROOT` (default `~/.cache/polar_mq/harnesses`), and every rollout reuses them.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polar_mq.cli.common import fail
from polar_mq.config import Settings
from polar_mq.harnesses.presets.install import InstallError, install, installed_versions
from polar_mq.harnesses.presets.registry import get_preset, presets

harness_app = typer.Typer(no_args_is_help=True, help="Preset agent harnesses on this node.")
console = Console(stderr=True)


def _root() -> Settings:
    try:
        return Settings()
    except Exception as exc:  # a bad setting: a CLI message, not a traceback
        console.print(f"[red]configuration error:[/red] {exc}")
        raise typer.Exit(2) from exc


@harness_app.command("list")
def harness_list() -> None:
    """Every preset: its API family, package, pinned version and the versions installed here."""
    root = _root().harness_root
    table = Table("preset", "API family", "package", "default", "installed")
    for name, preset in presets().items():
        package = preset.package
        table.add_row(
            name,
            preset.api_family,
            escape(f"{package.ecosystem}:{package.name}{package.extras}"),  # "[openai]" is text
            package.default_version,
            ", ".join(installed_versions(root, name)) or "-",
        )
    Console().print(table)


@harness_app.command("install")
def harness_install(
    names: Annotated[
        list[str] | None, typer.Argument(help="NAME or NAME@VERSION (default version: pinned)")
    ] = None,
    all_presets: Annotated[bool, typer.Option("--all", help="every preset")] = False,
) -> None:
    """Install presets into this node's cache (a no-op for an installed version)."""
    root = _root().harness_root
    wanted = list(presets()) if all_presets else list(names or [])
    if not wanted:
        raise fail("name a preset (see `polar-mq harness list`) or --all", 2, to=console)
    failed = 0
    for item in wanted:
        name, _, version = item.partition("@")
        preset = get_preset(name)
        if preset is None:
            known = ", ".join(presets())
            raise fail(f"unknown preset {name!r}; known: {known}", 2, to=console)
        version = version or preset.package.default_version
        try:
            report = install(
                root, name, preset.package, version, log=lambda line: console.print(escape(line))
            )
        except InstallError as exc:
            console.print(f"[red]{name}@{version} failed:[/red] {escape(str(exc))}")
            failed += 1
            continue
        state = "cached" if report.cached else "installed"
        console.print(
            f"{name}@{version} {state} in {report.seconds:.1f}s: {report.install.bin_dir}"
        )
    if failed:
        raise typer.Exit(1)
